"""Load a `datagen export --format specforge` file with SpecForge's OWN code, as its scripts do.

Why: a schema written here could agree with itself and still not be what SpecForge reads. This
script imports SpecForge's modules from a checkout (``--specforge-src``; nothing of it is copied
into this project) and makes the calls its entry points make:

- offline (``scripts/prepare_hidden_states.py``): ``Dataset.from_generator`` over
  ``specforge.utils.safe_conversations_generator``, then ``build_eagle3_dataset``;
- training (``load_dataset("json")`` then ``build_eagle3_dataset``).

``build_eagle3_dataset`` applies the chat template of a Hugging Face tokenizer (``--tokenizer``, e.g.
the engines' tiny-llm folder) through SpecForge's parser for ``--template``. The package
``specforge/__init__.py`` is not executed (it imports the training stack); only the data modules
and what they import (torch, transformers, datasets) are needed. Run it with a python that has
those, e.g. the engines' venv (``../shared/engines/setup.sh sglang``). It prints one JSON summary
and exits 1 when a path fails to load, a row is lost, or a row trains on no token.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any


def import_specforge(src: Path) -> tuple[Any, Any]:
    """SpecForge's ``data.preprocessing`` and ``utils`` modules, without running its package ``__init__``."""
    for name, folder in (("specforge", src / "specforge"), ("specforge.data", src / "specforge" / "data")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return importlib.import_module("specforge.data.preprocessing"), importlib.import_module("specforge.utils")


def trained_rows(processed: Any) -> int:
    """Rows with at least one token in the loss mask: a row with none teaches the drafter nothing."""
    return sum(1 for mask in processed["loss_mask"] if sum(sum(m) for m in mask) > 0)


def check(export: Path, src: Path, tokenizer_dir: Path, template: str) -> dict[str, Any]:
    from datasets import Dataset, load_dataset
    from transformers import AutoTokenizer

    preprocessing, utils = import_specforge(src)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lines = sum(1 for line in export.read_text(encoding="utf-8").splitlines() if line.strip())
    result: dict[str, Any] = {"rows": lines, "template": template}
    with tempfile.TemporaryDirectory() as cache:
        loaded = {
            "offline": Dataset.from_generator(
                utils.safe_conversations_generator, gen_kwargs={"file_path": str(export)}, cache_dir=cache
            ),
            "training": load_dataset("json", data_files=str(export), split="train", cache_dir=cache),
        }
        for path, dataset in loaded.items():
            processed = preprocessing.build_eagle3_dataset(
                dataset, tokenizer, chat_template=template, max_length=4096, num_proc=1
            )
            result[path] = {
                "columns": dataset.column_names,
                "processed": len(processed),
                "trained": trained_rows(processed),
            }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="a specforge.jsonl written by `datagen export`")
    parser.add_argument("--specforge-src", type=Path, required=True, help="a SpecForge checkout")
    parser.add_argument(
        "--tokenizer", type=Path, required=True, help="a tokenizer folder with a chat template"
    )
    parser.add_argument("--template", default="qwen", help="SpecForge chat template name (default qwen)")
    args = parser.parse_args(argv)
    result = check(args.export, args.specforge_src, args.tokenizer, args.template)
    print(json.dumps(result, indent=2))
    ok = all(
        "tools" in result[path]["columns"]
        and result[path]["processed"] == result[path]["trained"] == result["rows"]
        for path in ("offline", "training")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
