"""The CPU products of the torch forward (models/cpu_linear.py): oneDNN's inner product
agrees with F.linear to float rounding for any row count (0 included) with and without a
bias, the choice rules (default oneDNN on the CPU where it runs, F.linear elsewhere, bad
choices refused by name), and a model takes the chosen products for every linear of its
forward, the LM head included."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specd.errors import InvalidArgumentError
from specd.models import cpu_linear
from specd.models.llama import LlamaModel
from specd.models.loader import load_model

CPU = torch.device("cpu")


def _layer(n_in, n_out, bias, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(n_out, generator=gen))
    return layer.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 9, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_products_equal_f_linear_to_rounding(dtype, rows, bias):
    if dtype != torch.float32:
        assert cpu_linear.resolve(None, CPU, dtype) == cpu_linear.TORCH  # F.linear is oneDNN already
    if not cpu_linear.onednn_usable(dtype):
        assert cpu_linear.resolve(None, CPU, dtype) == cpu_linear.TORCH  # the default falls back
        with pytest.raises(InvalidArgumentError, match="does not run"):
            cpu_linear.resolve("onednn", CPU, dtype)
        return
    layer = _layer(96, 72, bias, dtype, rows)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        got = cpu_linear.onednn_linear(x, layer)
        want = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    assert got.shape == (rows, 72) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 10)
    # a non-contiguous input (a row selection's transpose-free view) gives the same rows
    wide = torch.randn(rows, 2 * 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.no_grad():
        torch.testing.assert_close(cpu_linear.onednn_linear(wide[:, ::2], layer).float(),
                                   cpu_linear.onednn_linear(wide[:, ::2].contiguous(), layer).float(), rtol=0, atol=0)


def test_choice_rules():
    onednn_here = cpu_linear.onednn_usable(torch.float32)
    assert cpu_linear.resolve(None, CPU, torch.float32) == (cpu_linear.ONEDNN if onednn_here else cpu_linear.TORCH)
    assert cpu_linear.resolve("torch", CPU, torch.float32) == cpu_linear.TORCH
    assert cpu_linear.resolve(None, CPU, torch.bfloat16) == cpu_linear.TORCH
    if cpu_linear.onednn_usable(torch.bfloat16):
        assert cpu_linear.resolve("onednn", CPU, torch.bfloat16) == cpu_linear.ONEDNN
    # never oneDNN off the CPU (the GPU forwards have their own products)
    assert cpu_linear.resolve(None, torch.device("cuda"), torch.float32) == cpu_linear.TORCH
    assert cpu_linear.resolve("onednn", torch.device("cuda"), torch.float32) == cpu_linear.TORCH
    with pytest.raises(InvalidArgumentError, match="cpu_linear must be None, 'onednn' or 'torch', got 'mkl'"):
        cpu_linear.resolve("mkl", CPU, torch.float32)
    assert cpu_linear.linear_for(cpu_linear.ONEDNN) is cpu_linear.onednn_linear
    assert cpu_linear.linear_for(cpu_linear.TORCH) is cpu_linear.torch_linear


def test_a_model_takes_its_chosen_products_everywhere(tiny_llama_dir, monkeypatch):
    """Every product of the torch forward (4 attention + 3 MLP per layer, and the LM head)
    goes through the model's choice; the two choices' logits agree to float32 rounding, and
    changing the choice takes effect at the next forward."""
    from test_model_parity import new_pool, run

    if not cpu_linear.onednn_usable(torch.float32):
        pytest.fail("torch's CPU build has oneDNN on every platform specd supports; this one refused a probe product")
    model = LlamaModel.from_loaded(load_model(tiny_llama_dir, torch.float32, tokenizer=False))
    calls = {"onednn": 0, "torch": 0}
    real_onednn, real_torch = cpu_linear.onednn_linear, cpu_linear.torch_linear

    def counted(name, fn):
        def wrapper(x, layer):
            calls[name] += 1
            return fn(x, layer)
        return wrapper

    monkeypatch.setattr(cpu_linear, "onednn_linear", counted("onednn", real_onednn))
    monkeypatch.setattr(cpu_linear, "torch_linear", counted("torch", real_torch))
    ids = [3, 17, 5, 9, 11]
    per_forward = 7 * model.config.num_hidden_layers + 1
    default = run(model, new_pool(model), ids, list(range(len(ids))))
    assert calls == {"onednn": per_forward + 1, "torch": 0}  # + the probe product of the choice's resolution
    run(model, new_pool(model), ids, list(range(len(ids))))
    assert calls == {"onednn": 2 * per_forward + 1, "torch": 0}  # resolved once
    model.cpu_linear = "torch"
    plain = run(model, new_pool(model), ids, list(range(len(ids))))
    assert calls == {"onednn": 2 * per_forward + 1, "torch": per_forward}
    torch.testing.assert_close(default, plain, rtol=1e-4, atol=1e-4)
    model.cpu_linear = "bad"
    with pytest.raises(InvalidArgumentError, match="got 'bad'"):
        run(model, new_pool(model), ids, list(range(len(ids))))


def test_the_benchmark_times_a_forward_with_each_choice(tiny_llama_dir):
    """bench/cpu_linear.py's forward timing (its real-pair run needs the pair; here a tiny model)."""
    from bench_scripts import load_script

    script = load_script("bench/cpu_linear.py")
    model = LlamaModel.from_loaded(load_model(tiny_llama_dir, torch.float32, tokenizer=False))
    for choice in script.CHOICES:
        model.cpu_linear = choice
        assert script.forward_ms(model, 3, 1) > 0
        assert model.linear_fn() is cpu_linear.linear_for(choice)
