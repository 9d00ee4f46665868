#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": which module costs GPTQ, and the v_proj attention-output Hessian (torch harness).
"""Where GPTQ loses to the imatrix on SmolLM2, and the attention-output Hessian for v_proj.

  bench/gptq/bench_gptq_attn.py --imatrix-gguf I.gguf --gptq-gguf G.gguf [--model smollm2-hf] [--chunks 10]
                             [--calib-samples 16] [--seq-len 512] [--type q4_0]

Python-side perplexity (torch, float32 activations) of the HF model whose decoder matrices are taken
from quantized GGUF files, module by module, on wiki-test (ctx 512, the second half of each window
scored, as llama-perplexity does): which matrices make GPTQ's file worse than the imatrix file.
``I.gguf``: ``ggml-ext convert --type q4_0 --imatrix`` (llama-quantize's bytes); ``G.gguf``:
``ggml-ext convert --method gptq`` with the same type; both from the same model.

Then the fix it points to. v_proj's output reaches the model only through attention:
o_q = sum_t A_qt v_t, so the error of a quantized V weight in the attention output is
||dW Z||^2 with Z_h = A_h X (the inputs mixed by head h's attention weights), not ||dW X||^2. GPTQ on
H = XᵀX pushes v_proj's rounding error into directions where X has little energy -- among them the
first (sink) token's, which every later query reads through its large attention weight. The
attention-output Hessian of kv head g is H_g = sum over the query heads h of g of Z_hᵀ Z_h; GPTQ
runs on each kv head's rows with its own H_g (static scales from diag H_g). The calibration stream
here runs the layers in float (not on quantized inputs), eager attention for the weights.

Rows printed: the spec ("base;file:layers:module-substring;..."), and its perplexity.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch


MAP = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
       "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
       "ffn_down": "mlp.down_proj"}


def load_gguf(path: str, cfg) -> dict:
    """Decoder matrices of a GGUF, dequantized, in the HF checkpoint's row order."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    out = {}
    for t in GGUFReader(path).tensors:
        p = t.name.split(".")
        if p[0] != "blk" or p[2] not in MAP:
            continue
        w = dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
        if p[2] in ("attn_q", "attn_k"):   # undo the converter's RoPE row permutation
            nh = cfg.num_attention_heads if p[2] == "attn_q" else cfg.num_key_value_heads
            w = w.reshape(nh, w.shape[0] // nh // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        out[f"model.layers.{p[1]}.{MAP[p[2]]}.weight"] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def attention_v_proj(hf: str, type_name: str, n: int, seq_len: int, percdamp: float) -> tuple[dict, dict]:
    """GPTQ (static scales) of every v_proj with H = XᵀX and with the per-kv-head attention-output Hessian."""
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    from ggml_ext.methods import gptq as G
    tok = tokenize(hf, "wiki-train", n_samples=n, seq_len=seq_len)
    st = LayerStream(hf)
    st.model.set_attn_implementation("eager")
    c = st.config
    nh, nkv = c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // nh
    acc: dict = {}

    def hooks(i, layer, prefix):
        a = acc.setdefault(i, {"H": 0, "Hg": [0] * nkv})

        def pre(m, args):
            a["x"] = args[0].detach()[0].double()

        def post(m, args, out):
            A = out[1]
            if A is None:
                raise RuntimeError("the attention returned no weights (eager attention needed)")
            X = a.pop("x")
            a["H"] = a["H"] + X.T @ X
            Z = A[0].double() @ X
            for h in range(nh):
                a["Hg"][h // (nh // nkv)] = a["Hg"][h // (nh // nkv)] + Z[h].T @ Z[h]
        h1 = layer.self_attn.v_proj.register_forward_pre_hook(pre)
        h2 = layer.self_attn.register_forward_hook(post)
        return lambda: (h1.remove(), h2.remove())

    plain, attn = {}, {}
    torch.set_num_threads(1)
    for i, layer, prefix in st.run(tok.ids, hooks=hooks, progress=True):
        W = layer.self_attn.v_proj.weight.detach().float().numpy().copy()
        a = acc.pop(i)
        key = f"model.layers.{i}.self_attn.v_proj.weight"
        plain[key] = torch.from_numpy(G.gptq(W, a["H"].numpy(), type_name, scale_rule="static", percdamp=percdamp).Q)
        attn[key] = torch.from_numpy(np.concatenate([
            G.gptq(W[g * hd:(g + 1) * hd], a["Hg"][g].numpy(), type_name, scale_rule="static", percdamp=percdamp).Q
            for g in range(nkv)]))
    return plain, attn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imatrix-gguf", required=True)
    ap.add_argument("--gptq-gguf", required=True)
    ap.add_argument("--model", default="smollm2-hf")
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--percdamp", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--specs", default=None,
                    help="comma-separated specs to score instead of the default list (e.g. 'i,g,i;va:0-99:v_proj')")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from ggml_ext import assets
    hf = str(assets.path(a.model))
    vp, va = attention_v_proj(hf, a.type.upper(), a.calib_samples, a.seq_len, a.percdamp)
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(hf)(open(assets.path("wiki-test")).read(), return_tensors="pt").input_ids[0]
    files = {"i": load_gguf(a.imatrix_gguf, model.config), "g": load_gguf(a.gptq_gguf, model.config),
             "vp": vp, "va": va}
    orig = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = 512

    def ppl() -> float:
        nll, cnt = 0.0, 0
        with torch.no_grad():
            for c in range(a.chunks):
                x = ids[c * ctx:(c + 1) * ctx][None]
                lp = torch.log_softmax(model(x).logits[0, :-1].float(), -1).gather(1, x[0, 1:, None])[:, 0]
                lp = lp[ctx // 2 - 1:]
                nll -= lp.sum().item()
                cnt += lp.numel()
        return float(np.exp(nll / cnt))

    specs = a.specs.split(",") if a.specs else ["f32", "i", "g", "i;g:0-29:self_attn", "i;g:0-29:mlp", "i;g:0-14:.", "i;g:15-29:.",
             "i;g:0-29:q_proj", "i;g:0-29:v_proj", "i;g:0-29:down_proj",
             "i;vp:0-99:v_proj", "i;va:0-99:v_proj", "g;va:0-99:v_proj"]
    print(f"# {a.model} {a.type}: python-side PPL, wiki-test ctx {ctx}, {a.chunks} chunks; i = imatrix file, "
          f"g = gptq file, vp/va = v_proj by GPTQ with H = XᵀX / with the attention-output Hessian")
    for spec in specs:
        sd = {k: v.clone() for k, v in orig.items()}
        parts = spec.split(";")
        if parts[0] != "f32":
            sd.update(files[parts[0]])
        for r in parts[1:]:
            name, lay, sub = r.split(":")
            lo, hi = map(int, lay.split("-"))
            sd.update({k: v for k, v in files[name].items() if lo <= int(k.split(".")[2]) <= hi and sub in k})
        model.load_state_dict(sd)
        print(f"{spec:24s} {ppl():.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
