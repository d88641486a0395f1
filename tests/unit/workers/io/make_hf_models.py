"""Creates tiny Hugging Face models with `transformers` (the independent reference) for the
engine's model-I/O tests, and records what `transformers` computes on fixed tokens.

  make_hf_models.py OUT_DIR        -> OUT_DIR/{llama,qwen3,qwen3moe,qwen3moe_ties,qwen3moe_aux,gptoss}/ (save_pretrained: the hub's
                                      layout, experts one by one) and .../reference.safetensors with
                                      tokens, losses, grad norms, first-step gradients and weights
                                      after two AdamW steps; qwen3moe, qwen3moe_aux and gptoss also reference_async.safetensors
                                      (staleness 1: both steps apply the gradient at the first weights)
                                      OUT_DIR/gptoss_mxfp4/ (experts stored as MXFP4 blocks and scales)
                                      and OUT_DIR/{lora,lora_moe,lora_gptoss,lora_moe_experts,lora_gptoss_experts}/ (base, PEFT
                                      adapter, peft's two steps)
  make_hf_models.py --only NAME OUT_DIR   (or OUT_DIR --only NAME)
                                        -> only that model (llama, qwen3, qwen3moe, qwen3moe_ties, qwen3moe_aux, gptoss
                                             or gptoss_mxfp4) and its references; qwen3moe_aux and
                                             qwen3moe_aux_batch also reference_linear.safetensors
                                             (three steps, lr 1e-2, eps 0.1)
  make_hf_models.py --check-close EXPORT_DIR REFERENCE_DIR
                                   -> the export holds the reference's trained weights (tolerances in
                                      check_close)
  make_hf_models.py --check-moved EXPORT_DIR MODEL_DIR REFERENCE_FILE
                                   -> every tensor of the export within 1e-4 of how far transformers
                                      moved it (REFERENCE_FILE's after.*, from MODEL_DIR's weights)
  make_hf_models.py --check-equal EXPORT_DIR ENGINE.safetensors
                                   -> the export, loaded by transformers, holds exactly these tensors
  make_hf_models.py --check EXPORT_DIR REFERENCE_DIR
                                   -> loads the engine's export with transformers and compares
                                      every tensor with the reference model's trained weights
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig

LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]

LR = 1e-3


def make(out, only=None):
    torch.manual_seed(1234)
    configs = {
        "llama": LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                             rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        "qwen3": Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                             rope_theta=1000000.0, max_position_embeddings=256, tie_word_embeddings=True),
        # Six experts, top-2, renormalised; block 1 dense (mlp_only_layers), blocks 0 and 2 sparse.
        "qwen3moe": Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=256,
                                   tie_word_embeddings=False, num_experts=6, num_experts_per_tok=2,
                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                                   output_router_logits=False),
        # Recompute fidelity: top-1 of four experts, where the router rows of experts 0 and 1
        # differ by ~1e-4 (near-ties that bf16 rounding of the probabilities cannot tell apart).
        "qwen3moe_ties": Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                        max_position_embeddings=256, tie_word_embeddings=False, num_experts=4,
                                        num_experts_per_tok=1, norm_topk_prob=False, decoder_sparse_step=1,
                                        output_router_logits=False),
        # The router's auxiliary loss (coefficient above the default 0.001 so its gradient shows).
        "qwen3moe_aux": Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                       rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=256,
                                       tie_word_embeddings=False, num_experts=6, num_experts_per_tok=2,
                                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                                       output_router_logits=True, router_aux_loss_coef=0.05),
        # The aux loss over a whole batch as one micro-batch (4 rows of 24): eight experts, top-2,
        # the last block dense, the default-sized coefficient.
        "qwen3moe_aux_batch": Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                             moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                                             rope_theta=1000000.0, max_position_embeddings=256,
                                             tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
                                             output_router_logits=True, router_aux_loss_coef=0.01),
        # Sparse every second block (decoder_sparse_step 2: blocks 1 and 3 of 4), aux loss on.
        "qwen3moe_step2": Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                         moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                                         rope_theta=1000000.0, max_position_embeddings=256,
                                         tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                                         norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                                         output_router_logits=True, router_aux_loss_coef=0.05),
        # GPT-OSS: sinks, a 4-token window in blocks 0 and 2 (sequences of 24), YaRN, biases, a
        # SwiGLU limit low enough to clamp, and the router's aux loss.
        "gptoss": gpt_oss_config(16, output_router_logits=True, router_aux_loss_coef=0.05),
        # GPT-OSS without q/k/v/o biases (attention_bias false; router and expert biases stay).
        "gptoss_nobias": gpt_oss_config(16, attention_bias=False),
    }
    tokens = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(7))
    for name, cfg in configs.items():
        if only and name != only:
            continue
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg).float()
        # Non-trivial norm weights so a mix-up of norms would show.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                if name.startswith("gptoss"):
                    gpt_oss_weights(n, p)
                if name == "qwen3moe_ties" and n.endswith("mlp.gate.weight"):
                    p[0] *= 3
                    p[1] = p[0] + 1e-4 * torch.randn_like(p[0])
        model.save_pretrained(f"{out}/{name}", safe_serialization=True)
        backward = aux_backward if name in ("qwen3moe_aux", "qwen3moe_step2", "gptoss") else plain_backward
        if name == "qwen3moe_aux_batch":
            backward = aux_backward_batch
        if name in ("qwen3moe_aux_batch", "qwen3moe_aux"):
            # Three steps where AdamW's update follows the gradient (eps 0.1 >> sqrt(v)), so a
            # gradient error of any step shows in the weights after (with eps 1e-8 AdamW's update
            # is sign-like and amplifies rounding where a moment nearly cancels).
            again = AutoModelForCausalLM.from_pretrained(f"{out}/{name}", dtype=torch.float32,
                                                         attn_implementation="eager")
            save_file(train_steps(again, tokens, backward, steps=3, lr=1e-2, eps=0.1),
                      f"{out}/{name}/reference_linear.safetensors")
        save_file(train_steps(model, tokens, backward), f"{out}/{name}/reference.safetensors")
        if name in ("qwen3moe", "qwen3moe_aux", "gptoss"):
            make_async_reference(f"{out}/{name}", tokens, backward)
    if not only or only == "gptoss_mxfp4":
        make_mxfp4(out, tokens)
    if only:
        print("made", only)
        return
    make_lora(out, configs["llama"], tokens)
    make_lora(out, configs["qwen3moe"], tokens, name="lora_moe", targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    gpt = gpt_oss_config(16)
    gpt._attn_implementation = "eager"
    make_lora(out, gpt, tokens, name="lora_gptoss", targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    # LoRA on the stacked experts (PEFT's target_parameters): both of Qwen3-MoE's, GPT-OSS's gate_up.
    make_lora(out, configs["qwen3moe"], tokens, name="lora_moe_experts", targets=["q_proj", "v_proj"],
              target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    make_lora(out, gpt, tokens, name="lora_gptoss_experts", targets=["q_proj"],
              target_parameters=["mlp.experts.gate_up_proj"])
    print("made", ", ".join(configs), "and LoRA adapters (llama, qwen3moe, gptoss, experts)")


def gpt_oss_config(expert_width, **kw):
    return GptOssConfig(vocab_size=96, hidden_size=32, intermediate_size=expert_width, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64, rms_norm_eps=1e-5,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "truncate": False, "original_max_position_embeddings": 16,
                                         "rope_theta": 150000.0},
                        swiglu_limit=0.2, tie_word_embeddings=False, **kw)


def gpt_oss_weights(name, p):
    """Biases and sinks that matter (transformers starts expert biases at 0, sinks near 0), and
    queries and keys large enough for peaked attention (so windows, sinks and rope show)."""
    if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
        p.mul_(10)
    elif name.endswith("sinks"):
        p.normal_(0, 1)
    elif name.endswith("bias"):
        p.normal_(0, 0.1)


def make_mxfp4(out, tokens):
    """A GPT-OSS whose experts are stored as the hub stores openai's: MXFP4 `_blocks` (two E2M1
    values per byte) and `_scales` (E8M0), random; everything else fp32. The reference trains the
    model transformers' convert_moe_packed_tensors dequantises them to (and records those weights
    as `loaded.`)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    torch.manual_seed(4321)
    cfg = gpt_oss_config(32)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).float()
    gen = torch.Generator().manual_seed(5)
    tensors, loaded = {}, {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            gpt_oss_weights(n, p)
            if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                e, a, b = p.shape  # stored transposed: [E, b, a/32, 16] blocks, [E, b, a/32] scales
                blocks = torch.randint(0, 256, (e, b, a // 32, 16), dtype=torch.uint8, generator=gen)
                scales = torch.randint(119, 124, (e, b, a // 32), dtype=torch.uint8, generator=gen)
                p.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                tensors[n + "_blocks"], tensors[n + "_scales"] = blocks, scales
                loaded["loaded." + n] = p.detach().clone()
            else:
                tensors[n] = p.detach().clone().contiguous()
    d = f"{out}/gptoss_mxfp4"
    model.save_pretrained(d, safe_serialization=True)  # config.json (and fp32 weights, replaced below)
    save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})
    with open(f"{d}/config.json") as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(f"{d}/config.json", "w") as f:
        json.dump(config, f, indent=2)
    ref = train_steps(model, tokens, aux_backward if cfg.output_router_logits else plain_backward)
    ref.update(loaded)
    save_file(ref, f"{d}/reference.safetensors")


def plain_backward(model, tokens):
    """transformers' own loss on the whole batch, backpropagated. Returns (loss, {})."""
    out_ = model(input_ids=tokens, labels=tokens)
    out_.loss.backward()
    return out_.loss.item(), {}


def aux_backward(model, tokens):
    """One iteration as the engine runs it, each sequence a micro-batch: the loss is the CE summed
    over the micro-batch's tokens / the batch's tokens, plus coef * transformers' aux_loss of that
    micro-batch's forward / the micro-batch count; gradients accumulated. Returns (loss,
    {"aux_losses": the aux part})."""
    coef = model.config.router_aux_loss_coef
    micro = [tokens[i:i + 1] for i in range(tokens.size(0))]
    n = sum(m[:, 1:].numel() for m in micro)
    total, aux_total = 0.0, 0.0
    for m in micro:
        o = model(input_ids=m, output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(o.logits[:, :-1].reshape(-1, o.logits.size(-1)).float(),
                                               m[:, 1:].reshape(-1), reduction="sum")
        loss = ce / n + coef * o.aux_loss / len(micro)
        loss.backward()
        total += loss.item()
        aux_total += (coef * o.aux_loss / len(micro)).item()
    return total, {"aux_losses": aux_total}


def aux_backward_batch(model, tokens):
    """transformers' own loss of the whole batch as one forward (one micro-batch): CE mean over
    the batch's targets + coef * aux_loss over all its tokens. Returns (loss, {"aux_losses"})."""
    out_ = model(input_ids=tokens, labels=tokens, output_router_logits=True)
    out_.loss.backward()
    return out_.loss.item(), {"aux_losses": (model.config.router_aux_loss_coef * out_.aux_loss).item()}


def grad_norm(model):
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()


def train_steps(model, tokens, backward, steps=2, lr=LR, eps=1e-8):
    """`steps` AdamW steps of `backward`: tokens, losses (and what else backward reports, per
    step), grad norms, the first two steps' gradients (grad., grad2.) and the weights after."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=0.0)
    ref = {"tokens": tokens.clone()}
    series = {"losses": [], "grad_norms": []}
    for step in range(steps):
        loss, extra = backward(model, tokens)
        series["losses"].append(loss)
        series["grad_norms"].append(grad_norm(model))
        for k, v in extra.items():
            series.setdefault(k, []).append(v)
        for n, p in model.named_parameters():
            ref[("grad." if step == 0 else "grad%d." % (step + 1)) + n] = p.grad.detach().clone()
        opt.step()
        opt.zero_grad()
    for k, v in series.items():
        ref[k] = torch.tensor(v, dtype=torch.float64)
    for n, p in model.state_dict().items():
        ref["after." + n] = p.detach().clone().contiguous()
    return ref


def make_async_reference(model_dir, tokens, backward):
    """The asynchronous optimizer's trajectory on the same batch twice: staleness 1, so the second
    iteration still sees the first weights and both steps apply the same gradient."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    loss, _ = backward(model, tokens)
    norm = grad_norm(model)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for _ in range(2):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        opt.step()
    ref = {"tokens": tokens.clone(), "losses": torch.tensor([loss] * 2, dtype=torch.float64),
           "grad_norms": torch.tensor([norm] * 2, dtype=torch.float64)}
    for (n, _), g in zip(model.named_parameters(), grads):
        ref["grad." + n] = g.contiguous()
    for n, p in model.state_dict().items():
        ref["after." + n] = p.detach().clone().contiguous()
    save_file(ref, f"{model_dir}/reference_async.safetensors")


def make_lora(out, cfg, tokens, name="lora", targets=LORA_TARGETS, target_parameters=None):
    """A base model and a PEFT LoRA adapter (random A and B), trained 2 AdamW steps by peft:
    OUT/NAME/{base,adapter,reference.safetensors}."""
    from peft import LoraConfig, PeftModel, get_peft_model
    torch.manual_seed(99)
    base = AutoModelForCausalLM.from_config(cfg).float()
    if cfg.model_type == "gpt_oss":
        with torch.no_grad():
            for n, p in base.named_parameters():
                gpt_oss_weights(n, p)
    base.save_pretrained(f"{out}/{name}/base", safe_serialization=True)
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False,
                      task_type="CAUSAL_LM", target_parameters=target_parameters)
    model = get_peft_model(base, lcfg)
    model.save_pretrained(f"{out}/{name}/adapter", safe_serialization=True)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in trainable], lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ref = {"tokens": tokens.clone()}
    losses, norms = [], []
    for _ in range(2):
        o = model(input_ids=tokens, labels=tokens)
        o.loss.backward()
        losses.append(o.loss.item())
        norms.append(torch.sqrt(sum((p.grad.double() ** 2).sum() for _, p in trainable)).item())
        opt.step()
        opt.zero_grad()
    ref["losses"] = torch.tensor(losses, dtype=torch.float64)
    ref["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    for n, p in trainable:
        ref["after." + n.replace("base_model.model.", "").replace(".default", "")] = p.detach().clone()
    save_file(ref, f"{out}/{name}/reference.safetensors")


def check_lora(adapter_dir, merged_dir, base_dir, reference_dir):
    """The engine's PEFT export loads with peft and holds the trained adapters; its merged export
    equals peft's merge_and_unload of the same adapters."""
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir)
    ref = load_file(f"{reference_dir}/reference.safetensors")
    worst, count = 0.0, 0
    for n, p in model.named_parameters():
        if "lora_" not in n:
            continue
        want = ref["after." + n.replace("base_model.model.", "").replace(".default", "")]
        worst = max(worst, (p - want).abs().max().item())
        count += 1
    merged_ref = model.merge_and_unload().state_dict()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32).state_dict()
    worst_merged = max((merged[n] - t).abs().max().item() for n, t in merged_ref.items())
    print(f"peft loads the adapter: {count} tensors, max |diff| {worst:.3g}; merged max |diff| {worst_merged:.3g}")
    return 0 if count > 0 and worst < 2e-5 and worst_merged < 2e-5 else 1


def check(export_dir, reference_dir):
    model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    ref = load_file(f"{reference_dir}/reference.safetensors")
    worst = 0.0
    for n, p in model.state_dict().items():
        want = ref["after." + n]
        worst = max(worst, (p - want).abs().max().item())
    print(f"export loads with transformers: {len(model.state_dict())} tensors, max |diff| {worst:.3g}")
    return 0 if worst < 2e-5 else 1


def check_close(export_dir, reference_dir):
    """The export, loaded by transformers, holds the reference's weights after training: within
    2e-6 + 1e-4 |w|, or 4e-4 where a step's gradient was below 2e-5 (nearly cancelling sums; see
    hf_io_test.cc's Qwen3-MoE test)."""
    model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    ref = load_file(f"{reference_dir}/reference.safetensors")
    bad = []
    for n, p in model.state_dict().items():
        want = ref["after." + n]
        diff = (p - want).abs()
        small = (ref["grad." + n].abs() < 2e-5) | (ref["grad2." + n].abs() < 2e-5)
        ok = (diff <= 2e-6 + 1e-4 * want.abs()) | (small & (diff <= 4e-4))
        if not bool(ok.all()):
            bad.append(f"{n} (max |diff| {diff.max().item():.3g})")
    print(f"export loads with transformers: {len(model.state_dict())} tensors, off: {bad}")
    return 0 if not bad else 1


def check_moved(export_dir, model_dir, reference_file):
    """Every tensor of the export, loaded by transformers, within 1e-4 of how far transformers'
    own training moved it (max |export - after| <= 1e-4 max |after - before| + 1e-8): a gradient
    error in any one tensor at any step shows, where |w|-relative tolerances would hide it."""
    model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    before = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).state_dict()
    ref = load_file(reference_file)
    bad, worst = [], 0.0
    for n, p in model.state_dict().items():
        want = ref["after." + n]
        moved = (want - before[n]).abs().max().item()
        diff = (p - want).abs().max().item()
        worst = max(worst, diff / moved if moved > 0 else 0.0)
        if diff > 1e-4 * moved + 1e-8:
            bad.append(f"{n} (max |diff| {diff:.3g}, moved {moved:.3g})")
    print(f"export loads with transformers: {len(model.state_dict())} tensors, worst diff/moved {worst:.3g}, "
          f"off: {bad}")
    return 0 if not bad else 1


def check_equal(export_dir, engine_weights):
    """The export loaded by transformers holds exactly the engine's weights (fp32 both ways)."""
    model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    engine = load_file(engine_weights)
    state = model.state_dict()
    missing = sorted(set(engine) ^ set(state))
    worst = max((state[n] - engine[n]).abs().max().item() for n in engine if n in state)
    print(f"export loads with transformers: {len(state)} tensors, max |diff| {worst:.3g}, unmatched {missing}")
    return 0 if worst == 0 and not missing else 1


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "--check-equal":
        sys.exit(check_equal(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "--check-moved":
        sys.exit(check_moved(sys.argv[2], sys.argv[3], sys.argv[4]))
    if sys.argv[1] == "--check-close":
        sys.exit(check_close(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "--only":
        sys.exit(make(sys.argv[3], only=sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[2] == "--only":  # OUT_DIR --only NAME (tests' CachedOracle order)
        sys.exit(make(sys.argv[1], only=sys.argv[3]))
    if sys.argv[1] == "--check-lora":
        sys.exit(check_lora(*sys.argv[2:6]))
    make(sys.argv[1])
