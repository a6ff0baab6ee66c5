"""transformers' ``from_pretrained`` through :func:`gdpath.safetensors.install` (issue 39, item
5): a small random Llama saved sharded by transformers itself (``save_pretrained`` with a small
``max_shard_size``: several shards and ``model.safetensors.index.json``), loaded plain and then
with gdpath installed, must give every tensor of the state dict bitwise equal and the same logits
on a fixed input, on the CPU and with ``device_map="cuda:0"``.

A test that passes because nothing was routed proves nothing, so gdpath's file opening
(``gdpath.safetensors._open``, under ``safe_open``, ``load_file`` and ``load(bytes)`` alike) is
counted: the installed load must open every shard through gdpath, and the plain one none.
transformers reads a checkpoint through ``safe_open(file, framework="pt", device="cpu",
backend="mmap")`` and ``get_slice(name)`` materialised later with ``[...]`` from a thread pool
(``modeling_utils`` / ``core_model_loading``), or ``safetensors.torch.load(bytes)`` with
``disable_mmap=True``; both routes are tested. Skips aloud without PyTorch or transformers (the
GPU suite has both), and the CUDA case without a GPU."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("PyTorch and transformers are not both installed here (the GPU suite has them)",
                allow_module_level=True)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import gdpath.safetensors as gst  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              tie_word_embeddings=False)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A random Llama (fixed seed, bf16 weights, as checkpoints are shipped) saved by transformers
    in shards of at most 64 KB: the directory and its shard files."""
    d = tmp_path_factory.mktemp("llama")
    torch.manual_seed(39)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    with torch.no_grad():  # norms start as ones: random values make every byte count
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(d, max_shard_size="64KB")
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) >= 3 and (d / "model.safetensors.index.json").is_file(), shards
    return d, shards


@pytest.fixture
def opened(monkeypatch):
    """What gdpath read: the shard file names it opened (``_open``, under ``safe_open`` and
    ``load_file``) and ``"<bytes>"`` for each buffer ``load(bytes)`` parsed
    (``_bytes_checkpoint``)."""
    seen: list = []
    real_open, real_bytes = gst._open, gst._bytes_checkpoint

    def counting(files):
        names = [files] if isinstance(files, (str, bytes)) or hasattr(files, "__fspath__") else files
        seen.extend(str(f).rsplit("/", 1)[-1] for f in names)
        return real_open(files)

    def counting_bytes(data):
        seen.append("<bytes>")
        return real_bytes(data)

    monkeypatch.setattr(gst, "_open", counting)
    monkeypatch.setattr(gst, "_bytes_checkpoint", counting_bytes)
    return seen


def load(path, installed: bool, **kw):
    """``(state_dict, logits)`` of ``from_pretrained(path, **kw)`` on a fixed input, with gdpath
    installed for the load only when ``installed``."""
    if installed:
        gst.install()
    try:
        model = LlamaForCausalLM.from_pretrained(path, **kw)
    finally:
        gst.uninstall()
    model.eval()
    dev = next(model.parameters()).device
    ids = (torch.arange(16, device=dev).reshape(2, 8) * 37) % CONFIG["vocab_size"]
    with torch.no_grad():
        logits = model(ids).logits
    return model.state_dict(), logits


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (host, uint8), for a bitwise comparison that NaN or -0.0 cannot fool."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_same(plain, ours) -> None:
    sd_a, logits_a = plain
    sd_b, logits_b = ours
    assert list(sd_a) == list(sd_b)
    for k in sd_a:
        a, b = sd_a[k], sd_b[k]
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), k
        assert torch.equal(bits(a), bits(b)), f"{k}: not bitwise equal"
    assert torch.equal(bits(logits_a), bits(logits_b)), "logits differ"


def check(sharded, opened, via_bytes: bool = False, **kw) -> None:
    d, shards = sharded
    plain = load(d, installed=False, **kw)
    assert opened == [], f"the plain load went through gdpath: {opened}"
    ours = load(d, installed=True, **kw)
    # transformers may also open a shard for its metadata: the bytes route counts buffers.
    got = opened.count("<bytes>") if via_bytes else sorted(set(opened))
    assert got == (len(shards) if via_bytes else shards), f"gdpath read {opened}, the checkpoint is {shards}"
    assert_same(plain, ours)
    # uninstall() put safetensors back: the next plain load is safetensors' again.
    opened.clear()
    load(d, installed=False, **kw)
    assert opened == []


def test_install_routes_every_name_transformers_uses():
    """The names transformers' modules imported from safetensors before install() are gdpath's
    while installed and safetensors' after."""
    import transformers.modeling_utils as mu

    before = {n: getattr(mu, n) for n in ("safe_open", "_safe_load_bytes") if hasattr(mu, n)}
    assert "safe_open" in before, f"transformers {transformers.__version__}: no safe_open in modeling_utils"
    gst.install()
    try:
        assert mu.safe_open is gst.safe_open
        if "_safe_load_bytes" in before:
            import gdpath.safetensors.torch as gt

            assert mu._safe_load_bytes is gt.load
    finally:
        gst.uninstall()
    assert {n: getattr(mu, n) for n in before} == before


def test_from_pretrained_cpu_identical_through_gdpath(sharded, opened):
    check(sharded, opened)


def test_from_pretrained_bytes_route_identical_through_gdpath(sharded, opened):
    """``disable_mmap=True``: transformers reads each shard and calls ``safetensors.torch.load``
    on its bytes (where this transformers has the argument)."""
    import inspect

    if "disable_mmap" not in inspect.signature(LlamaForCausalLM.from_pretrained).parameters and \
            "disable_mmap" not in inspect.getsource(transformers.modeling_utils):
        pytest.skip(f"transformers {transformers.__version__} has no disable_mmap")
    check(sharded, opened, via_bytes=True, disable_mmap=True)


def test_from_pretrained_cuda_identical_through_gdpath(sharded, opened):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the device_map=\"cuda:0\" load runs in the GPU suite")
    if int(transformers.__version__.split(".")[0]) < 5 and importlib.util.find_spec("accelerate") is None:
        pytest.skip(f"transformers {transformers.__version__} needs accelerate for device_map")
    check(sharded, opened, device_map="cuda:0")
