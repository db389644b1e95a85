"""Which growth rule each DeepSpeed release's DynamicLossScaler.update_scale has, read from the sdists on
PyPI (deepspeed/runtime/fp16/loss_scaler.py in each):

- "today's": grows when `stable_interval = cur_iter - last_overflow_iter - 1` is positive and a
  multiple of scale_window (loss_scale=dynamic_hysteresis);
- "earlier": grows when `(cur_iter - last_overflow_iter) % scale_window == 0`, one clean step sooner,
  as Megatron-LM does (loss_scale=megatron).

    python tools/deepspeed_growth_rule.py 0.16.9 0.17.0 0.17.1     # the releases to read; none: every one
"""

import io
import json
import re
import sys
import tarfile
import urllib.request

INDEX = "https://pypi.org/simple/deepspeed/"
FILE = "deepspeed/runtime/fp16/loss_scaler.py"


def sdists() -> dict:
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
    return {f["filename"][len("deepspeed-"):-len(".tar.gz")]: f["url"] for f in files
            if f["filename"].endswith(".tar.gz")}


def rule(source: str) -> str:
    if "stable_interval" in source:
        return "today's"
    if re.search(r"\(self\.cur_iter - self\.last_overflow_iter\) % self\.scale_window == 0", source):
        return "earlier"
    return "neither (read the file)"


def main(versions) -> None:
    urls = sdists()
    for version in versions or sorted(urls, key=lambda v: [int(p) if p.isdigit() else -1
                                                          for p in re.split(r"[.]", v)]):
        if version not in urls:
            print(f"{version}: no sdist on PyPI")
            continue
        data = urllib.request.urlopen(urls[version], timeout=120).read()
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            names = [n for n in archive.getnames() if n.endswith(FILE)]
            if not names:
                print(f"{version}: no {FILE}")
                continue
            print(f"{version}: {rule(archive.extractfile(names[0]).read().decode())}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
