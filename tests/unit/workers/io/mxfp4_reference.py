"""Random MXFP4 blocks and scales, dequantised by transformers' own convert_moe_packed_tensors
(the independent reference), for mxfp4_test.cc:

  mxfp4_reference.py OUT.safetensors
     -> blocks [3, 5, 4, 16] and scales [3, 5, 4] (uint8; every scale 0..255 appears, edge cases
        included) and transformers' result in bfloat16, float32 and float16 (its layout:
        [3, 4 * 32, 5], the last two dimensions transposed)
"""
import sys

import torch
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

g = torch.Generator().manual_seed(5)
blocks = torch.randint(0, 256, (3, 5, 4, 16), generator=g, dtype=torch.int32).to(torch.uint8)
scales = torch.randperm(256, generator=g)[:60].reshape(3, 5, 4).to(torch.uint8)
scales.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)  # the range's ends
out = {"blocks": blocks, "scales": scales}
for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32), ("f16", torch.float16)):
    out[name] = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype).contiguous()
save_file(out, sys.argv[1])
print("wrote", sys.argv[1])
