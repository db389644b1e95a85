"""A refusal as every bad-input test expects it: exit 2, one line naming the key, no traceback, nothing
written."""


def assert_refused(out, says: str, folder) -> None:
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("lsexp")]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr and list(folder.iterdir()) == []
