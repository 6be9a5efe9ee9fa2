"""Every writer killed (SIGKILL) mid-write: a load then finds the earlier state, or refuses with an
error naming the file at fault, never a mix of two saves."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.atomic_io import TMP_PREFIX
from ddtree_jax.bench.record import load_result, write_result
from ddtree_jax.checkpoint import load_target, restore_checkpoint, save_checkpoint, save_target_hf
from ddtree_jax.config import DrafterConfig, ModelConfig
from ddtree_jax.drafter import init_drafter
from ddtree_jax.drafter_io import DrafterCheckpointError, load_drafter, save_drafter
from ddtree_jax.safetensors_io import PENDING, CheckpointError
from ddtree_jax.training.trainer import Trainer
from tests.io_testing import assert_identical, random_params, run_killed

CFG = ModelConfig.preset("tiny")
SHARD = 40_000     # bytes: the tiny target in several shards


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two different float32 parameter sets of the tiny target, each saved as an HF checkpoint."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, seed in (("old", 0), ("new", 1)):
        params = random_params(CFG, jnp.float32, seed)
        save_target_hf(root / name, CFG, params)
        out[name] = (params, str(root / name))
    return out


def _temporaries(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(TMP_PREFIX))


@pytest.mark.parametrize("old_shards, new_shards", [(SHARD, None), (None, SHARD), (SHARD, SHARD)],
                         ids=["sharded-to-single", "single-to-sharded", "sharded-to-sharded"])
def test_hf_save_killed_while_writing_keeps_the_old_checkpoint(tmp_path, models, old_shards, new_shards):
    dest = tmp_path / "ckpt"
    save_target_hf(dest, CFG, models["old"][0], max_shard_bytes=old_shards)
    code = (f"import jax.numpy as jnp; from ddtree_jax.checkpoint import load_target, save_target_hf\n"
            f"cfg, p = load_target({models['new'][1]!r}, jnp.float32)\n"
            f"save_target_hf({str(dest)!r}, cfg, p, max_shard_bytes={new_shards})\n")
    # the last weight file the save writes, torn halfway
    run_killed(code, tmp_path / "marker", ("ddtree_jax.safetensors_io.save_file", 2 if new_shards else 1, 1))
    assert _temporaries(dest)
    assert_identical(load_target(dest, jnp.float32)[1], models["old"][0])
    save_target_hf(dest, CFG, models["new"][0], max_shard_bytes=new_shards)    # cleans up
    assert not _temporaries(dest) and not (dest / PENDING).exists()
    assert_identical(load_target(dest, jnp.float32)[1], models["new"][0])


def test_hf_save_killed_while_renaming_is_refused_until_saved_again(tmp_path, models):
    dest = tmp_path / "ckpt"
    save_target_hf(dest, CFG, models["old"][0], max_shard_bytes=SHARD)
    code = (f"import jax.numpy as jnp; from ddtree_jax.checkpoint import load_target, save_target_hf\n"
            f"cfg, p = load_target({models['new'][1]!r}, jnp.float32)\n"
            f"save_target_hf({str(dest)!r}, cfg, p, max_shard_bytes={SHARD})\n")
    # os.replace: 1 puts the pending record in place, 2 config.json, 3 the first shard
    run_killed(code, tmp_path / "marker", ("os.replace", 3))
    pending = str(dest / PENDING).replace(".", r"\.")
    with pytest.raises(CheckpointError, match=f"{pending}: a save into .* did not finish"):
        load_target(dest, jnp.float32)
    save_target_hf(dest, CFG, models["old"][0])
    assert sorted(os.listdir(dest)) == ["config.json", "model.safetensors"]
    assert_identical(load_target(dest, jnp.float32)[1], models["old"][0])


def test_drafter_save_killed_while_writing_keeps_the_old_drafter(tmp_path):
    dcfg = DrafterConfig.for_target(CFG, block_size=4)
    old, new = (init_drafter(dcfg, jax.random.key(s), jnp.float32) for s in (0, 1))
    save_drafter(tmp_path / "new", dcfg, new)
    dest = tmp_path / "drafter"
    save_drafter(dest, dcfg, old)
    code = (f"import jax.numpy as jnp; from ddtree_jax.drafter_io import load_drafter, save_drafter\n"
            f"cfg, p = load_drafter({str(tmp_path / 'new')!r}, jnp.float32)\n"
            f"save_drafter({str(dest)!r}, cfg, p)\n")
    run_killed(code, tmp_path / "marker", ("ddtree_jax.safetensors_io.save_file", 1, 1))
    assert_identical(load_drafter(dest, jnp.float32)[1], old)
    (dest / PENDING).write_text("{}")
    with pytest.raises(DrafterCheckpointError, match=PENDING.replace(".", r"\.")):
        load_drafter(dest, jnp.float32)


@pytest.mark.parametrize("existing", [True, False], ids=["overwrite", "new"])
def test_orbax_save_killed_before_its_swap(tmp_path, models, existing):
    dest = tmp_path / "orbax"
    if existing:
        save_checkpoint(dest, CFG, models["old"][0])
    code = (f"import jax.numpy as jnp; from ddtree_jax.checkpoint import load_target, save_checkpoint\n"
            f"cfg, p = load_target({models['new'][1]!r}, jnp.float32)\n"
            f"save_checkpoint({str(dest)!r}, cfg, p, overwrite=True)\n")
    run_killed(code, tmp_path / "marker", ("ddtree_jax.atomic_io._fsync_tree", 1))
    assert any(n.startswith(TMP_PREFIX + "orbax.") for n in os.listdir(tmp_path))   # the new tree, unswapped
    if existing:
        assert_identical(restore_checkpoint(dest)[1], models["old"][0])
    else:
        with pytest.raises(CheckpointError, match=f"config.json not found in {dest}"):
            restore_checkpoint(dest)
    save_checkpoint(dest, CFG, models["new"][0], overwrite=True)      # and the next save cleans up
    assert sorted(os.listdir(tmp_path)) == ["marker", "orbax"]
    assert_identical(restore_checkpoint(dest)[1], models["new"][0])


def test_trainer_killed_mid_save_resumes_from_a_whole_step(tmp_path):
    """The trainer saves steps 1, 2, ... (every array of step s holds s) until killed; the resumed
    state is one whole saved step."""
    work = tmp_path / "work"
    code = (f"import numpy as np; from ddtree_jax.training.trainer import Trainer\n"
            f"t = Trainer({str(work)!r})\n"
            f"for s in range(1, 10_000):\n"
            f"    t.save(dict(params={{'w': np.full((256, 1024), s, np.float32)}}, opt_state=np.full(4096, s),\n"
            f"                step=np.int32(s), total_steps=np.int32(10_000), losses=np.full(10_000, s, np.float32)))\n"
            f"    if s == 2: open({str(tmp_path / 'marker')!r}, 'w').close()\n")
    run_killed(code, tmp_path / "marker", after_s=0.4)
    fresh = dict(params={"w": np.zeros((256, 1024), np.float32)}, opt_state=np.zeros(4096, np.int64),
                 step=np.int32(0), total_steps=np.int32(10_000), losses=np.zeros(10_000, np.float32))
    t = Trainer(str(work))
    try:
        state = t.restore_or(fresh)
    finally:
        t.close()
    s = int(state["step"])
    assert s >= 2
    np.testing.assert_array_equal(state["params"]["w"], np.full((256, 1024), s, np.float32))
    np.testing.assert_array_equal(state["opt_state"], np.full(4096, s))
    np.testing.assert_array_equal(state["losses"][:s], np.full(s, s, np.float32))


def test_result_write_killed_midway_keeps_the_old_record(tmp_path):
    record = dict(benchmark="moe", command="python3 x.py", commit="abc", date="2026-01-01T00:00:00Z",
                  device={"name": "cpu", "count": 1, "driver": None}, versions={}, ceilings={},
                  rows=[{"x": 1}])
    path = write_result(str(tmp_path), record)
    code = (f"from ddtree_jax.bench.record import write_result\n"
            f"write_result({str(tmp_path)!r}, {dict(record, rows=[{'x': 2}] * 1000)!r})\n")
    run_killed(code, tmp_path / "marker", ("json.dump", 1, 1))
    assert load_result(path) == record
    tmp = [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]
    with pytest.raises(ValueError, match=f"{tmp[0]}: not valid JSON"):
        load_result(str(tmp_path / tmp[0]))     # the torn new record, never read as the result
    assert json.loads((tmp_path / os.path.basename(path)).read_text()) == record
