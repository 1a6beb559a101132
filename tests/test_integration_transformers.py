"""The Hugging Face Trainer callback, against the real Trainer on the CPU with a tiny BERT built from
its config: a pause and a resume give the uninterrupted run's numbers, no epoch is trained twice, a
pruned run ends cleanly, the output folder is the run's checkpoint folder, a forgotten resume is
said in the log, and save_strategy="best" is refused."""

import os
import shutil

import pytest
from run_side import RunSide, framework

from gpu_task_scheduler import reporting


@pytest.fixture(scope="module")
def example():
    return framework("transformers", needs="accelerate")


@pytest.fixture
def run(tmp_path, monkeypatch):
    return RunSide(tmp_path, monkeypatch)


def test_a_paused_and_resumed_training_gives_the_uninterrupted_numbers(example, run, tmp_path):
    whole = example.train(3e-3, 16, 5, str(tmp_path / "by-hand"))
    run.attempt_at(pause_at=2)
    first = example.train(3e-3, 16, 5, str(tmp_path / "out"))
    assert first["epochs"] == 2 and run.steps() == [1, 2]
    assert reporting.paused_cause() == "paused at rung 2"
    checkpoints = os.path.join(run.folder, "checkpoint")
    assert os.listdir(checkpoints) == ["checkpoint-16"] and not (tmp_path / "out" / "checkpoint-16").exists()
    # What a kill in the middle of the Trainer's next save leaves: a newer folder without its
    # trainer_state.json (written last). The resume takes the newest whole one.
    os.mkdir(os.path.join(checkpoints, "checkpoint-24"))
    with open(os.path.join(checkpoints, "checkpoint-24", "model.safetensors"), "wb") as handle:
        handle.write(b"half")
    run.attempt_at(resume=2)
    assert example.resume_from() == os.path.join(checkpoints, "checkpoint-16")
    second = example.train(3e-3, 16, 5, str(tmp_path / "out"))
    assert run.steps() == [3, 4, 5] and second["epochs"] == 5  # each epoch trained once
    assert second["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-4)
    assert run.lines()[-1]["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-4)


def test_a_pruned_training_ends_cleanly(example, run, tmp_path):
    run.attempt_at(prune_at=1)
    assert example.train(3e-3, 16, 5, str(tmp_path))["epochs"] == 1 and run.steps() == [1]
    assert reporting.pruned_cause() == "pruned at step 1"


def test_a_forgotten_resume_is_said_and_save_best_refused(example, run, tmp_path, capfd, monkeypatch):
    run.attempt_at(pause_at=1)
    example.train(3e-3, 16, 3, str(tmp_path))
    run.attempt_at(resume=1)
    monkeypatch.setattr(example, "resume_from", lambda: None)
    example.train(3e-3, 16, 2, str(tmp_path))
    said = capfd.readouterr().err
    assert "was not given the run's checkpoint, so it trains again from the start" in said
    assert "pass resume_from_checkpoint=resume_from() to trainer.train()" in said
    from transformers import Trainer, TrainingArguments

    from gpu_task_scheduler.integrations.transformers import GTSCallback

    args = TrainingArguments(output_dir=str(tmp_path), eval_strategy="epoch", save_strategy="best", use_cpu=True)
    args.metric_for_best_model = "loss"
    tiny = example.BertConfig(
        vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    model = example.BertForSequenceClassification(tiny)
    with pytest.raises(ValueError, match='save_strategy="best"'):
        Trainer(model=model, args=args, eval_dataset=example.Sequences(8, seed=1), callbacks=[GTSCallback()])


def test_resume_from_gives_the_newest_whole_checkpoint_of_several(run):
    """By step number (checkpoint-100 is newer than checkpoint-20), whole ones only (a folder without
    trainer_state.json was cut off by a kill in the Trainer's save)."""
    pytest.importorskip("transformers", reason="the frameworks extra")
    from gpu_task_scheduler.integrations.transformers import resume_from

    run.attempt_at(resume=100)
    checkpoints = os.path.join(run.folder, "checkpoint")
    for step, whole in ((8, True), (20, True), (100, True), (120, False)):
        os.makedirs(os.path.join(checkpoints, f"checkpoint-{step}"))
        if whole:
            with open(os.path.join(checkpoints, f"checkpoint-{step}", "trainer_state.json"), "w") as handle:
                handle.write("{}")
    assert resume_from() == os.path.join(checkpoints, "checkpoint-100")
    run.attempt_at()  # a fresh start: no checkpoint to go on from
    assert resume_from() is None


def _train_recording(example, lr, schedule, epochs, out, **callback):
    """The example's training at ``lr`` under ``schedule`` (``constant``, ``warm-up``: linear over 8
    steps then linear decay, ``cosine``), resumed where the run resumes: the rate the optimizer
    used at each global step, and the final evaluation loss."""
    from transformers import TrainerCallback

    from gpu_task_scheduler.integrations.transformers import GTSCallback, resume_from

    rates = {}

    class Rates(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            rates[state.global_step] = optimizer.param_groups[0]["lr"]

    kinds = {"constant": ("constant", 0), "warm-up": ("linear", 8), "cosine": ("cosine", 0)}
    kind, warmup = kinds[schedule]
    trainer = example.make_trainer(
        lr,
        16,
        epochs,
        out,
        callbacks=[GTSCallback(**callback), Rates()],
        lr_scheduler_type=kind,
        warmup_steps=warmup,
        weight_decay=0.01,
    )
    trainer.train(resume_from_checkpoint=resume_from())
    return rates, trainer.evaluate()["eval_loss"]


@pytest.mark.parametrize("schedule", ["constant", "warm-up", "cosine"])
def test_a_member_that_copied_a_checkpoint_trains_at_its_own_rate(example, run, tmp_path, capfd, schedule):
    """Population-based training's copy, as the member sees it: its checkpoint folder holds the
    donor's checkpoint-16 (lr 3e-3, after 2 epochs); it resumes with its own lr 1.5e-3. At every
    step after the copy the optimizer's rate is the member's own schedule's (not the donor's, as
    scheduler.pt's base rates would make it), and the log says so; with ``reapply=False`` it is
    the donor's, and the log says that too."""
    own, _ = _train_recording(example, 1.5e-3, schedule, 4, str(tmp_path / "by-hand"))
    ended = {}
    for reapply in (True, False):
        shutil.rmtree(os.path.join(run.folder, "checkpoint"), ignore_errors=True)
        run.attempt_at(pause_at=2)
        _train_recording(example, 3e-3, schedule, 4, str(tmp_path / "out"))
        run.attempt_at(resume=2)
        capfd.readouterr()
        rates, ended[reapply] = _train_recording(example, 1.5e-3, schedule, 4, str(tmp_path / "out"), reapply=reapply)
        said = capfd.readouterr().err
        assert sorted(rates) == list(range(16, 32))  # the steps after the copy, each once
        factor = 1 if reapply else 2
        expected = [own[step] * factor for step in sorted(rates)]
        assert [rates[step] for step in sorted(rates)] == pytest.approx(expected, rel=1e-9)
        if reapply:
            base = "base lr" if schedule != "constant" else "lr"
            assert f"{base} 0.003 (restored) -> 0.0015 (this run's config)" in said
        else:
            assert "reapply=False: the values the Trainer restored stay" in said
    assert ended[True] != ended[False]  # not the donor's rate: the copying member ends elsewhere
