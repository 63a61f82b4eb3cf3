"""bench/verify_logits.py (sampled verification from the target's logits against sampling_probs
then verify_stochastic) on the CPU at a small size: it runs, both forms give the same outputs
(it returns 1 otherwise), for float32 and bfloat16 logits and a top-p cut, and the acceptance
knob works."""

from bench_scripts import load_script, mean_accepted


def test_verify_logits_runs_and_agrees(capsys):
    script = load_script("bench/verify_logits.py")
    args = ["--batch", "6", "--k", "3", "--vocab", "500", "--reps", "1"]
    assert script.main(args + ["--accept", "1"]) == 0
    text = capsys.readouterr().out
    assert "outputs equal: True" in text and "verify_stochastic_logits" in text and mean_accepted(text) > 0
    assert script.main(args + ["--accept", "0", "--dtype", "bfloat16", "--temperature", "0.7", "--top-p", "0.9"]) == 0
    text = capsys.readouterr().out
    assert "outputs equal: True" in text and mean_accepted(text) == 0
