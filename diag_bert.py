"""Temporary: what BERT's graph looks like on CUDA (not committed)."""
import torch, transformers, os
print("transformers", transformers.__version__, "torch", torch.__version__)
from ember.runtime.bench.measure import prepare
model, inputs = prepare("bert", torch.device("cuda"), torch.bfloat16)
def backend(gm, ex):
    code = gm.code
    i = code.find("scaled_dot_product")
    print("sdpa found at", i)
    lines = [l for l in code.splitlines() if "attention" in l.lower() or "sdpa" in l or "scaled_dot" in l or "softmax" in l or "matmul" in l][:20]
    print("\n".join(lines))
    return gm.forward
with torch.no_grad():
    torch.compile(model, backend=backend)(*inputs)
os.environ["EMBER_DEBUG_DIR"] = os.environ["OUT"] + "/dbg"
