"""Hugging Face transformers prefill and decode speed for a Llama-architecture model with
RANDOM weights built from a config (no hub access, no tokenizer). Standalone: imports only
torch, transformers and the standard library, so the file can be copied to any machine.

    python bench/hf_decode.py --model smollm2 --device cuda --dtype bf16 --out OUT.json
    python bench/hf_decode.py --model llama1b --device cuda --modes eager,cuda-graph
    python bench/hf_decode.py --smoke --device cpu --dtype fp32          # 2-layer self-check

Shapes (`--model`):
    smollm2   SmolLM2-135M: 30 layers, hidden 576, ffn 1536, 9 heads / 3 KV heads, head_dim 64,
              vocab 49152, rope_theta 1e5, tied embeddings
    llama1b   Llama-3.2-1B: 16 layers, hidden 2048, ffn 8192, 32 heads / 8 KV heads, head_dim 64,
              vocab 128256, rope_theta 5e5 with llama3 rope scaling (factor 32, low 1, high 4,
              original 8192), tied embeddings
    --smoke   the chosen shape cut to 2 layers and a 4096-token vocabulary (and, unless given,
              16 prompt / 8 new tokens, 2 repeats): a fast check that every mode works.

The prompt is --prompt-tokens random ids (seeded). Decoding is greedy: after the prefill (one
forward over the prompt, logits of the last position only), --new-tokens one-token forwards,
each fed the argmax of the previous logits; the tokens compared between modes are the prefill's
argmax followed by the --new-tokens decode argmaxes. The argmax stays on the device: nothing in
the decode loop waits for the host (EOS does not stop it), so "eager" is eager PyTorch at its
best, not model.generate's per-token bookkeeping ("generate" mode measures that).

Modes (`--modes`, comma-separated; default all four):
    eager       DynamicCache, the model's forward called once per token.
    static      StaticCache(max_cache_len = prompt + new tokens); the one-token step below called
                eagerly. Same ops as cuda-graph, so it is the exact reference for it; runs on CPU too.
    cuda-graph  StaticCache; the one-token step (forward on static input_ids/position_ids
                [/cache_position] tensors, argmax, feed the argmax back, advance the position)
                captured once with torch.cuda.CUDAGraph after 3 warm-up steps on a side stream,
                then replayed once per token. No torch.compile. Skipped (with a reason) off CUDA.
    generate    model.generate(do_sample=False, min_new_tokens = max_new_tokens = new + 1),
                default DynamicCache: what a plain transformers user gets.

Static cache and capture (transformers 5.x, read from cache_utils.py): StaticLayer keeps its
write position in a device tensor (`cumulative_length`) that update() advances in place, so a
captured step replays correctly with no cache_position argument; the causal mask over the
max_cache_len keys is built from that tensor with device ops (sdpa; the is_causal skip is
disabled for compileable caches when q_length == 1), and Cache.reset() zeroes keys, values and
the position in place, keeping addresses. transformers 4.x instead takes `cache_position` (and
`past_key_values` rather than `cache`): the script passes whatever the installed forward()
accepts, found by inspect.signature, and keeps a static cache_position tensor for 4.x. The first
prefill allocates the cache (lazy in 5.x); the warm-up steps scribble on positions >= prompt,
which every later run resets before its own prefill.

Timing: torch.cuda.synchronize() before and after every timed region (perf_counter). Run 0 is
cold (first prefill/decode on a fresh cache; for cuda-graph it also includes warm-up and capture,
reported separately as capture_s); runs 1..--repeats are warm (reset, the same prompt again);
warm figures are medians. tokens_match: a mode's greedy tokens equal eager's; cuda-graph also
reports tokens_match_static (equal to the eager static-cache step, the same kernels).
Random weights in bf16 can put two logits within rounding of each other, so a mismatch against
eager (different attention kernels) is possible without a bug; a mismatch against static is not.
Exit status 1 if a mode raised (its traceback is in the JSON).
"""
from __future__ import annotations

import argparse
import inspect
import json
import pathlib
import platform
import statistics
import sys
import time
import traceback

# `python bench/hf_decode.py` puts bench/ first on sys.path, and bench/kernels.py then shadows
# the Hugging Face `kernels` package that transformers 5.x imports: every model class fails
# with "Could not import module 'LlamaConfig'" (seen on the lent H200). Drop that entry.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != pathlib.Path(__file__).resolve().parent]

import torch  # noqa: E402  (after the sys.path fix above)
import transformers  # noqa: E402

SHAPES = {
    "smollm2": {
        "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
        "rope_theta": 100000.0, "rope_scaling": None, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "max_position_embeddings": 2048,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    "llama1b": {
        "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 131072,
        "bos_token_id": 128000, "eos_token_id": 128001,
    },
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODES = ("eager", "static", "cuda-graph", "generate")
WARMUP_STEPS = 3            # eager steps on a side stream before capture (cuBLAS/SDPA workspaces)
SEED = 20261130


# -- model -------------------------------------------------------------------------------------

def model_config(name: str, smoke: bool) -> dict:
    cfg = dict(SHAPES[name])
    if smoke:
        cfg["num_hidden_layers"] = 2
        cfg["vocab_size"] = 4096
        cfg["bos_token_id"], cfg["eos_token_id"] = 1, 2
    return cfg


def build_model(cfg: dict, dtype: torch.dtype, device: torch.device):
    """Random weights (transformers' own init, seeded) made directly on the device in `dtype`,
    as from_pretrained does it: buffers computed in explicit float32 (RoPE inv_freq) stay f32."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(**cfg, attn_implementation="sdpa")
    if getattr(config, "_attn_implementation", None) != "sdpa":
        config._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.requires_grad_(False)
    if config.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.tie_weights()
    return model


class Forward:
    """model(...) with the keyword names the installed transformers accepts."""

    def __init__(self, model):
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache_position = "cache_position" in params
        self.keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)

    def __call__(self, ids, cache, position_ids, cache_position=None, last_only=False):
        kw = {"input_ids": ids, "position_ids": position_ids, self.cache_kw: cache, "use_cache": True}
        if self.cache_position and cache_position is not None:
            kw["cache_position"] = cache_position
        if last_only and self.keep_kw:
            kw[self.keep_kw] = 1
        return self.model(**kw).logits


def dynamic_cache(config):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def static_cache(config, max_len: int, dtype, device):
    from transformers import StaticCache
    # 5.x: (config, max_cache_len, **kwargs), lazily allocated on the first update;
    # 4.x: (config, max_batch_size, max_cache_len, device, dtype). Keywords fit both.
    return StaticCache(config=config, max_cache_len=max_len, max_batch_size=1, device=device, dtype=dtype)


# -- timing ------------------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill(fwd, prompt, cache, device):
    """One forward over the prompt; returns the argmax token [1, 1] and seconds."""
    n = prompt.shape[1]
    positions = torch.arange(n, device=device).unsqueeze(0)
    sync(device)
    t0 = time.perf_counter()
    logits = fwd(prompt, cache, positions, positions[0], last_only=True)
    token = logits[:, -1, :].argmax(-1, keepdim=True)
    sync(device)
    return token, time.perf_counter() - t0


class StaticStep:
    """The one-token decode step on static tensors: reads ids/position, writes the argmax back
    into ids and advances the position, all on the device (so it can be captured and replayed)."""

    def __init__(self, fwd, cache, device):
        self.fwd, self.cache = fwd, cache
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.cache_position = torch.zeros((1,), dtype=torch.long, device=device)

    def set(self, token, position: int) -> None:
        self.ids.copy_(token)
        self.position.fill_(position)
        self.cache_position.fill_(position)

    def __call__(self) -> None:
        logits = self.fwd(self.ids, self.cache, self.position, self.cache_position)
        self.ids.copy_(logits[:, -1, :].argmax(-1, keepdim=True))
        self.position.add_(1)
        self.cache_position.add_(1)


def run_once(mode, state, fwd, model, prompt, n_new, device, dtype):
    """One greedy generation; returns {prefill_s, decode_s, tokens, [capture_s]}."""
    n_prompt = prompt.shape[1]
    out = torch.zeros((1, n_new + 1), dtype=torch.long, device=device)
    result = {}
    if mode == "eager":
        cache = dynamic_cache(model.config)
        token, result["prefill_s"] = prefill(fwd, prompt, cache, device)
        out[:, :1] = token
        t0 = time.perf_counter()
        for i in range(n_new):
            position = torch.full((1, 1), n_prompt + i, dtype=torch.long, device=device)
            logits = fwd(token, cache, position, position[0])
            token = logits[:, -1, :].argmax(-1, keepdim=True)
            out[:, i + 1:i + 2] = token
        sync(device)
        result["decode_s"] = time.perf_counter() - t0
        del cache
    elif mode in ("static", "cuda-graph"):
        started = time.perf_counter()
        if "cache" not in state:
            state["cache"] = static_cache(model.config, n_prompt + n_new, dtype, device)
            state["step"] = StaticStep(fwd, state["cache"], device)
        else:
            state["cache"].reset()
        cache, step = state["cache"], state["step"]
        token, result["prefill_s"] = prefill(fwd, prompt, cache, device)
        out[:, :1] = token
        if mode == "cuda-graph" and "graph" not in state:
            # Warm up on a side stream, capture, then redo the prefill: the warm-up advanced the
            # cache position and wrote keys/values past the prompt.
            t0 = time.perf_counter()
            step.set(token, n_prompt)
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_STEPS):
                    step()
            torch.cuda.current_stream(device).wait_stream(stream)
            sync(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            sync(device)
            state["graph"] = graph
            result["capture_s"] = time.perf_counter() - t0
            cache.reset()
            token, result["prefill_s"] = prefill(fwd, prompt, cache, device)
            out[:, :1] = token
        step.set(token, n_prompt)
        replay = state["graph"].replay if mode == "cuda-graph" else step
        sync(device)
        t0 = time.perf_counter()
        for i in range(n_new):
            replay()
            out[:, i + 1:i + 2] = step.ids
        sync(device)
        result["decode_s"] = time.perf_counter() - t0
        if "capture_s" in result:
            result["first_run_total_s"] = time.perf_counter() - started
    elif mode == "generate":
        sync(device)
        t0 = time.perf_counter()
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=n_new + 1, min_new_tokens=n_new + 1,
                                   pad_token_id=model.config.eos_token_id)
        sync(device)
        result["total_s"] = time.perf_counter() - t0
        out = generated[:, n_prompt:n_prompt + n_new + 1]
    else:
        raise ValueError(mode)
    result["tokens"] = out[0].tolist()
    return result


def summarize(runs, n_prompt, n_new) -> dict:
    cold, warm = runs[0], runs[1:] or runs[:1]
    out = {"runs": len(runs), "warm_runs": len(runs) - 1}

    def figures(key, count, label):
        if key not in cold:
            return
        w = statistics.median(r[key] for r in warm)
        out[f"{label}_s_cold"], out[f"{label}_s_warm"] = cold[key], w
        out[f"{label}_tok_s_cold"] = count / cold[key] if cold[key] > 0 else None
        out[f"{label}_tok_s_warm"] = count / w if w > 0 else None
        out[f"{label}_s_all"] = [r[key] for r in runs]

    figures("prefill_s", n_prompt, "prefill")
    figures("decode_s", n_new, "decode")
    if "decode_s_warm" in out:
        out["decode_ms_per_token_warm"] = 1000 * out["decode_s_warm"] / n_new
        out["decode_ms_per_token_cold"] = 1000 * out["decode_s_cold"] / n_new
    if "total_s" in cold:   # generate: prefill + n_new + 1 tokens, one call
        figures("total_s", n_new + 1, "generate")
    for key in ("capture_s", "first_run_total_s"):
        if key in cold:
            out[key] = cold[key]
    out["tokens"] = cold["tokens"]
    out["deterministic_across_runs"] = all(r["tokens"] == cold["tokens"] for r in runs)
    return out


def first_mismatch(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


# -- main --------------------------------------------------------------------------------------

def environment(device) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "torch_cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=torch.cuda.get_device_name(device), gpu_capability=f"{p.major}.{p.minor}",
                   gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   cudnn=torch.backends.cudnn.version(),
                   matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32)
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="default 128 (16 with --smoke)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128 (8 with --smoke)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="warm runs after the cold one; default 5 (2 with --smoke)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--smoke", action="store_true", help="2 layers, vocab 4096, few tokens: a fast self-check")
    ap.add_argument("--out", default=None, help="JSON path (default: results/hf_decode_<model>_<device>_<dtype>"
                                                "[_smoke].json in this script's folder)")
    args = ap.parse_args(argv)

    n_prompt = args.prompt_tokens if args.prompt_tokens is not None else (16 if args.smoke else 128)
    n_new = args.new_tokens if args.new_tokens is not None else (8 if args.smoke else 128)
    repeats = args.repeats if args.repeats is not None else (2 if args.smoke else 5)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or n_prompt < 1 or n_new < 1 or repeats < 0:
        ap.error(f"bad arguments (unknown modes {unknown})" if unknown else "bad token counts or repeats")
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out_path = pathlib.Path(args.out) if args.out else (
        pathlib.Path(__file__).resolve().parent / "results" /
        f"hf_decode_{args.model}_{device.type}_{args.dtype}{'_smoke' if args.smoke else ''}.json")

    cfg = model_config(args.model, args.smoke)
    report = {"bench": "hf_decode", "model": args.model, "smoke": args.smoke, "dtype": args.dtype,
              "device": str(device), "config": cfg, "prompt_tokens": n_prompt, "new_tokens": n_new,
              "repeats": repeats, "seed": SEED, "environment": environment(device), "modes": {}}
    print(f"{args.model}{' (smoke)' if args.smoke else ''} {args.dtype} on {device}"
          f" ({report['environment'].get('gpu', platform.processor() or 'cpu')}), torch {torch.__version__},"
          f" transformers {transformers.__version__}; prompt {n_prompt}, new {n_new}, repeats {repeats}", flush=True)

    failed = False
    with torch.no_grad():
        t0 = time.perf_counter()
        model = build_model(cfg, dtype, device)
        sync(device)
        report["build_s"] = time.perf_counter() - t0
        report["parameters"] = sum(p.numel() for p in model.parameters())   # tied: embedding counted once
        report["tied_embeddings"] = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        report["rope_type"] = getattr(model.model.rotary_emb, "rope_type", None)
        fwd = Forward(model)
        report["forward_keywords"] = {"cache": fwd.cache_kw, "cache_position": fwd.cache_position,
                                      "logits_to_keep": fwd.keep_kw}
        generator = torch.Generator().manual_seed(SEED)
        prompt = torch.randint(0, cfg["vocab_size"], (1, n_prompt), generator=generator).to(device)

        for mode in modes:
            entry = report["modes"].setdefault(mode, {})
            if mode == "cuda-graph" and device.type != "cuda":
                entry["skipped"] = f"CUDA graphs need --device cuda (device is {device.type})"
                print(f"  {mode}: skipped: {entry['skipped']}", flush=True)
                continue
            state = {}
            try:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                runs = [run_once(mode, state, fwd, model, prompt, n_new, device, dtype) for _ in range(repeats + 1)]
                entry.update(summarize(runs, n_prompt, n_new))
                if device.type == "cuda":
                    entry["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
                if mode in ("static", "cuda-graph"):
                    entry["max_cache_len"] = n_prompt + n_new
            except Exception as exc:   # noqa: BLE001 -- report and carry on with the other modes
                failed = True
                entry["error"] = f"{type(exc).__name__}: {exc}"
                entry["traceback"] = traceback.format_exc()
                print(f"  {mode}: FAILED: {entry['error']}", flush=True)
                print(entry["traceback"], file=sys.stderr, flush=True)
            finally:
                state.clear()
                if device.type == "cuda":
                    sync(device)
                    torch.cuda.empty_cache()

    # correctness: every mode's greedy tokens against eager's (and cuda-graph against static)
    results = report["modes"]
    reference = results.get("eager", {}).get("tokens")
    for mode, entry in results.items():
        if "tokens" not in entry:
            continue
        if mode != "eager" and reference is not None:
            entry["tokens_match"] = entry["tokens"] == reference
            entry["first_mismatch_vs_eager"] = first_mismatch(entry["tokens"], reference)
        if mode == "cuda-graph" and "tokens" in results.get("static", {}):
            entry["tokens_match_static"] = entry["tokens"] == results["static"]["tokens"]
            entry["first_mismatch_vs_static"] = first_mismatch(entry["tokens"], results["static"]["tokens"])

    def fmt(value, spec):
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    print(f"\n{'mode':<11} {'prefill ms cold/warm':>21} {'prefill tok/s':>13} "
          f"{'decode ms/tok cold/warm':>23} {'decode tok/s':>12} {'match':>6}  notes")
    for mode, e in results.items():
        if "skipped" in e or "error" in e:
            print(f"{mode:<11} {e.get('skipped') or e.get('error')}")
            continue
        notes = []
        if "capture_s" in e:
            notes.append(f"capture {e['capture_s'] * 1000:.0f} ms")
        if "tokens_match_static" in e:
            notes.append(f"= static: {e['tokens_match_static']}")
        if "generate_s_warm" in e:
            notes.append(f"generate {e['generate_s_warm'] * 1000:.1f} ms for {n_new + 1} tokens "
                         f"({e['generate_tok_s_warm']:.1f} tok/s overall)")
        if not e.get("deterministic_across_runs", True):
            notes.append("tokens differ between runs")
        prefill_ms = decode_ms = "-"
        if "prefill_s_cold" in e:
            prefill_ms = f"{1000 * e['prefill_s_cold']:.2f}/{1000 * e['prefill_s_warm']:.2f}"
        if "decode_ms_per_token_warm" in e:
            decode_ms = f"{e['decode_ms_per_token_cold']:.3f}/{e['decode_ms_per_token_warm']:.3f}"
        match = "ref" if mode == "eager" else str(e.get("tokens_match", "-"))
        print(f"{mode:<11} {prefill_ms:>21} {fmt(e.get('prefill_tok_s_warm'), '.0f'):>13} "
              f"{decode_ms:>23} {fmt(e.get('decode_tok_s_warm'), '.1f'):>12} {match:>6}  {'; '.join(notes)}")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
