"""Writes the per-layer profiles of the paper's five §5.8.1 models (RTX 4090, 4 x 2048 tokens per
micro-batch) in roundpipe-sim's --profile format, from the per-layer figures the authors publish
with their artifact (its pipeline simulator's inputs: forward and backward time per decoder
layer, LM-head forward and backward, per-hop transfer time; milliseconds).

    python3 make_paper_profiles.py OUT_DIR

The artifact models no embedding (a zero-time layer here). A decoder layer's recompute+backward
is forward + backward (the backward stages recompute), its fused time forward + backward; the
head's fused time is its forward + backward.
"""
import json
import os
import sys

# name: (decoder layers, fwd ms, bwd ms, head fwd ms, head bwd ms, hop ms)
MODELS = {
    "qwen3-1.7b": (28, 7.429, 15.831, 22.0655, 43.707, 1.6),
    "llama-3.1-8b": (32, 18.50370313, 41.20659375, 37.2255, 74.501, 3.2),
    "gpt-oss-20b": (24, 21.6445625, 81.780875, 44.2925, 86.264, 2.25),
    "qwen3-32b": (64, 40.5610625, 91.17429688, 54.928, 108.294, 4.0),
    "qwen3-235b-a22b": (94, 43.016, 58.376, 42.444, 43.294, 3.2),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (n, f, b, hf, hb, hop) in MODELS.items():
        ms = 1e-3
        layers = [{"kind": "embedding", "forward_s": 0.0, "backward_s": 0.0, "fused_s": 0.0}]
        layers += [{"kind": "block", "forward_s": f * ms, "backward_s": (f + b) * ms, "fused_s": (f + b) * ms}
                   for _ in range(n)]
        layers.append({"kind": "head", "forward_s": hf * ms, "backward_s": (hf + hb) * ms,
                       "fused_s": (hf + hb) * ms})
        doc = {"format": "roundpipe.profile.v1",
               "name": f"{name}, RTX 4090, 4 x 2048 tokens (the authors' artifact figures)",
               "activation_hop_s": hop * ms, "layers": layers}
        with open(os.path.join(out, f"{name}.json"), "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
