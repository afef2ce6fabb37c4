"""The backends and devices a measurement may name, without importing torch (the command's
parser offers them)."""

BACKENDS = ("fbgemm", "torch_fused", "torch", "analytic")
DEVICES = ("auto", "cpu", "cuda")
