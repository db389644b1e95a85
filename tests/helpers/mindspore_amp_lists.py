"""MindSpore's published operator lists for amp_level="auto", transcribed as names, which the test of
amp=auto (tests/test_casts.py) predicts the cast map from, apart from auto_mixed_precision itself.

Transcribed from mindspore/train/amp.py of the installed wheel, mindspore.__version__ == "2.10.0"
(.venv/lib/python3.11/site-packages/mindspore/train/amp.py):

- AUTO_WHITE_LIST: AMP_AUTO_WHITE_LIST, lines 69-90 (the primitives' class names, in the file's order);
  also the docstring of auto_mixed_precision, lines 446-450.
- AUTO_BLACK_LIST: AMP_AUTO_BLACK_LIST, lines 92-139; also the docstring, lines 452-459.
- PROMOTE_LIST: the docstring of auto_mixed_precision, lines 461-464. amp.py holds no Python list of it:
  the graph compiler keeps its own (mindspore._c_expression.amp.AutoPromoteList, the same ten names).

What the level does with them, in the docstring's words (lines 441-444): "operators in `auto_whitelist`
will be converted to lower precision operations, operators in `auto_blacklist` will be converted to full
precision operations, operators in `promote_list` will be converted to the higher accuracy float type of
the operator inputs, and operators not listed will run in the type defined by their inputs". The "auto"
branch of auto_mixed_precision (lines 546-553) hands the two lists' names to the graph compiler, which
casts the floating inputs of each listed operator to that type as it builds the graph.
"""

MINDSPORE_VERSION = "2.10.0"

AUTO_WHITE_LIST = (
    "Conv2D", "Conv3D", "Conv2DExt", "Conv3DExt", "ConvTranspose2D", "Conv2DTranspose", "Conv3DTranspose",
    "Convolution", "MatMul", "MatMulExt", "BatchMatMul", "BatchMatMulExt", "PReLU", "Einsum", "Dense",
    "Addmm", "Addbmm", "Addmv", "Baddbmm", "Mv",
)

AUTO_BLACK_LIST = (
    "Pow", "ACos", "Asin", "Cosh", "Erfinv", "Exp", "Expm1", "Log", "Log10", "Log1p", "Log2", "Reciprocal",
    "Rsqrt", "Sinh", "Tan", "Softplus", "SoftplusExt", "LayerNorm", "LayerNormExt", "BatchNorm",
    "BatchNormExt", "GroupNorm", "Norm", "KLDivLoss", "SmoothL1Loss", "MultilabelMarginLoss",
    "SoftMarginLoss", "TripletMarginLoss", "MultiMarginLoss", "BCEWithLogitsLoss", "Pdist", "Cdist",
    "Renorm", "ReduceProd", "Softmax", "LogSoftmax", "LogSoftmaxExt", "CumProd", "CumSum", "CumsumExt",
    "ProdExt", "SumExt", "L1LossExt", "MSELossExt", "NLLLoss", "NLLLoss2d",
)

PROMOTE_LIST = (
    "Addcdiv", "Addcmul", "Cross", "_PyboostCrossPrim", "Dot", "GridSampler2D", "GridSampler3D", "BiasAdd",
    "AddN", "Concat",
)
