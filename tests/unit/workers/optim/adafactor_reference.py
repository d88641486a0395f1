"""The test oracle for the Adafactor kernel: torch.optim.Adafactor itself, over many steps.

    adafactor_reference.py OUT.safetensors CASE

Writes, for every parameter shape of the case, the initial values ("p0.K"), the gradient of each
step ("g.K.STEP"), and after the last step the parameter ("p.K") and torch's state ("row_var.K",
"col_var.K" or "variance.K"); the hyper-parameters go into the file's metadata. The C++ test
(adafactor_test.cc) runs our kernel from p0 with the same gradients and compares.
"""
import json
import sys

import torch
from safetensors.torch import save_file

SHAPES = [(37, 53), (53,), (2, 5, 7), (1, 300), (300, 1), (4096, 20), (600, 77)]
CASES = {
    # torch's defaults (lr 1e-2, beta2_decay -0.8, eps (None, 1e-3), d 1, no weight decay)
    "defaults": dict(lr=1e-2),
    # every term: weight decay, another decay rate, eps1 set, clipping at RMS 2, maximize
    "every_term": dict(lr=3e-2, beta2_decay=-0.6, eps=(1e-6, 1e-2), d=2.0, weight_decay=0.1, maximize=True),
}
STEPS = 40


def main():
    out, case = sys.argv[1], sys.argv[2]
    hyper = CASES[case]
    gen = torch.Generator().manual_seed(1234)
    tensors = {}
    params = []
    for k, shape in enumerate(SHAPES):
        p0 = torch.randn(shape, generator=gen) * (0.02 if k % 2 else 1.0)
        tensors[f"p0.{k}"] = p0.clone()
        params.append(torch.nn.Parameter(p0.clone()))
    opt = torch.optim.Adafactor(params, foreach=False, **hyper)
    for step in range(STEPS):
        for k, p in enumerate(params):
            # gradients of varied scale, some exactly zero rows (the eps floors matter there)
            g = torch.randn(p.shape, generator=gen) * (10.0 ** ((step % 5) - 2))
            if g.dim() >= 2 and step % 7 == 3:
                g[..., 0, :] = 0
            if k == 6:
                # the eps1 floor: a column of tiny gradients (its variance estimate below eps1^2
                # while the gradient is not zero) and a row that never sees a gradient
                g[:, 0] *= 1e-8
                g[-1, :] = 0
            tensors[f"g.{k}.{step}"] = g.clone()
            p.grad = g
        opt.step()
    for k, p in enumerate(params):
        tensors[f"p.{k}"] = p.detach().clone()
        st = opt.state[p]
        for name in ("row_var", "col_var", "variance"):
            if st.get(name) is not None:
                tensors[f"{name}.{k}"] = st[name].clone()
    meta = {"hyper": json.dumps(hyper), "steps": str(STEPS), "shapes": json.dumps(SHAPES)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, out, metadata=meta)


if __name__ == "__main__":
    main()
