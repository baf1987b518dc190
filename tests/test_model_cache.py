"""The model cache (tiny models, the converted embedded model) is shared by every process on the
machine: two notebooks, or `make test`'s two pytest processes, may build one folder at once. Each
folder is written whole beside its place and renamed into it, so no reader sees half of one."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

from workbench.models.loading import publish_folder
from workbench.models.tiny import MARKS, build_tiny_model


def _folder(path: Path, text: str, files=MARKS) -> Path:
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text(text)
    return path


def test_a_folder_published_first_is_kept_and_the_later_copy_dropped(tmp_path):
    target = _folder(tmp_path / "m", "first")
    later = _folder(tmp_path / ".m-later", "second")
    publish_folder(later, target, MARKS)
    assert (target / "model.safetensors").read_text() == "first"
    assert not later.exists()


def test_an_incomplete_folder_is_replaced_and_a_missing_one_made(tmp_path):
    target = _folder(tmp_path / "m", "half", files=("tokenizer.json",))  # a crash before the weights
    publish_folder(_folder(tmp_path / ".m-new", "whole"), target, MARKS)
    assert sorted(p.name for p in target.iterdir()) == sorted(MARKS)
    assert (target / "model.safetensors").read_text() == "whole"
    fresh = tmp_path / "fresh"
    publish_folder(_folder(tmp_path / ".fresh-x", "x"), fresh, MARKS)
    assert (fresh / "tokenizer.json").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _build_and_load(root: str, start, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start.wait()  # every process builds at the same moment
    path = build_tiny_model(hidden_size=64, num_layers=1, num_heads=2, vocab_size=300, root=Path(root))
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        weight_sum = float(sum(p.double().sum() for p in model.parameters()))
    out.put((str(path), weight_sum, len(tokenizer)))


def test_processes_building_one_tiny_model_at_once_all_load_the_same_whole_model(tmp_path):
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_build_and_load, args=(str(tmp_path), start, out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len({r for r in results}) == 1, results  # one folder, one set of weights, one vocabulary
    folder = Path(results[0][0])
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no scratch folder left behind
    assert (folder / "model.safetensors").is_file() and (folder / "workbench_tiny.json").is_file()


def _build(root: str) -> None:
    build_tiny_model(hidden_size=64, num_layers=1, num_heads=2, vocab_size=300, seed=1, root=Path(root))


def test_a_folder_being_built_is_never_seen_with_some_of_its_files(tmp_path):
    """Watch the folder's place while another process builds it: each look sees either no
    folder or the whole one (before, the folder was made first and filled file by file)."""
    proc = mp.get_context("spawn").Process(target=_build, args=(str(tmp_path),))
    proc.start()
    seen = set()
    while proc.is_alive():
        for entry in os.scandir(tmp_path):
            if not entry.name.startswith("."):
                try:
                    seen.add(tuple(sorted(os.listdir(entry.path))))
                except FileNotFoundError:
                    pass
        time.sleep(0.001)
    proc.join()
    assert proc.exitcode == 0
    final = tuple(sorted(os.listdir(next(p for p in tmp_path.iterdir() if not p.name.startswith(".")))))
    assert "model.safetensors" in final and "workbench_tiny.json" in final
    assert seen <= {final}, f"a reader saw a half-built folder: {sorted(seen - {final})}"
