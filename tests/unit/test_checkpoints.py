"""Checkpoints as a user's workers and disks make them: a state a weights-only load refuses is named with its
worker before anything is written, a damaged one is named with the checkpoint to go on from, one written again
replaces the old whole."""

from __future__ import annotations

import os

import numpy as np
import pytest

from m2flow.errors import CheckpointError
from m2flow.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


def good_state() -> dict:
    return {"env": [{"obs": np.zeros(3, np.float32), "steps": 4}], "learner": [{"lr": 0.1}]}


@pytest.mark.parametrize(
    ("value", "said"),
    [(object(), "a weights-only load refuses the global object"), (lambda: 0, "Can't pickle")],
    ids=["an object", "a function"],
)
def test_a_state_a_weights_only_load_refuses_is_named_with_its_worker_and_nothing_is_written(tmp_path, value, said):
    state = good_state()
    state["learner"][0]["extra"] = value
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(tmp_path, 0, state, {"env_steps": 0})
    message = str(caught.value)
    assert message.startswith("a checkpoint cannot hold the state_dict() of worker 'learner': ") and said in message
    assert "return tensors, numpy arrays and plain Python values" in message
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_checkpoint_is_named_with_the_one_before_it_to_go_on_from(tmp_path):
    for iteration in (0, 1):
        save_checkpoint(tmp_path, iteration, good_state(), {"env_steps": iteration})
    latest = latest_checkpoint(tmp_path)
    (latest / "state.pt").write_bytes((latest / "state.pt").read_bytes()[:100])
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(latest)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {latest}: its state.pt cannot be read (")
    assert message.endswith("it is damaged; remove that folder to go on from the checkpoint before it (iter_00000000)")


def test_a_checkpoint_replaced_by_a_run_killed_between_its_renames_is_found_again_as_it_was(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 3, good_state(), {"env_steps": 1})
    real_replace, renames = os.replace, []

    def killed_after_the_first(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:  # the old one set aside, the new one not yet in place
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, good_state(), {"env_steps": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (tmp_path / "iter_00000003").exists()
    found = latest_checkpoint(tmp_path)
    assert found == tmp_path / "iter_00000003" and load_checkpoint(found)[1]["env_steps"] == 1


def test_a_checkpoint_written_again_replaces_the_old_one_whole(tmp_path):
    save_checkpoint(tmp_path, 3, good_state(), {"env_steps": 1})
    newer = good_state()
    newer["learner"][0]["lr"] = 0.2
    path = save_checkpoint(tmp_path, 3, newer, {"env_steps": 2})
    state, meta = load_checkpoint(path)
    assert state["learner"][0]["lr"] == 0.2 and meta["env_steps"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_00000003"]  # no temporary or old copy left
