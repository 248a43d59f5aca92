"""The compressed-tensors layout of our W8A8 and W4A16 layers: schemes, tensor names, int4 nibbles.

compressed-tensors is the format vLLM and ``transformers`` (with the ``compressed-tensors`` package)
read from a model directory whose ``config.json`` holds ``quantization_config`` with
``quant_method: "compressed-tensors"``. Each quantized ``nn.Linear`` keeps its module name and stores
(N = out_features, K = in_features)::

    our module          format          tensors (besides ``bias``)
    W8A8Linear dynamic  int-quantized   weight (N, K) int8, weight_scale (N, 1)
    W8A8Linear static   int-quantized   weight, weight_scale, input_scale (1,)
    W4A16Linear         pack-quantized  weight_packed (N, ceil(K/8)) int32, weight_shape (2,) int64 = [N, K],
                                        weight_scale (N, K/G), or (N, 1) per channel

and its config group's scheme says how: weights ``int``, symmetric, 8 bits per output channel
(``strategy: channel``) or 4 bits per group of G input channels (``group``, ``group_size: G``) or per
channel; input activations ``int`` 8 bits, symmetric, per token computed at run time (``token``,
``dynamic: true``) or one calibrated scale (``tensor``, ``dynamic: false``), or none (W4A16).

The integers and scales are ours unchanged (scales written as float32): ``weight = w_q``,
``weight_scale = w_scale[:, None]``, ``input_scale = act_scale``; ``weight_scale = scales.T`` for W4A16.
Dequantized, both formats mean ``W[n, k] = q[n, k] * scale[n, k // G]``. What differs is how int4
values sit in an int32:

* ours (``compress.core.quant.pack_int4``): ``qweight`` (K/8, N), nibble ``k % 8`` (bits 4(k%8) ..
  4(k%8)+3) of ``qweight[k // 8, n]`` holds ``q[n, k]`` in two's complement;
* theirs: ``weight_packed`` (N, ceil(K/8)), the same nibble of ``weight_packed[n, k // 8]`` holds
  ``q[n, k] + 8`` (offset binary, 0..15); the nibbles after K in the last word are 0.

For q in [-8, 7], ``q + 8`` and ``q & 0xF`` differ only in the nibble's top bit, so one format
becomes the other by flipping bit 3 of every nibble (XOR with 0x88888888) and transposing.

compressed-tensors' group quantization needs G to divide K (it refuses a remainder), so a W4A16
layer whose K our module padded to the group size has no compressed-tensors form. Activation
scales: ours and vLLM's dynamic per-token scale is ``max|x[m, :]| / 127``; compressed-tensors' own
fake quantization (what ``transformers`` runs after decompressing) uses ``max|x[m, :]| / 127.5``, so the
two round some activations to neighbouring integers.
"""
from __future__ import annotations

import torch

from compress.checkpoint.manifest import CheckpointError
from compress.configs import W4_GROUP_SIZES, W4A16Config, W8A8Config
from compress.core.quant import pack_int4, unpack_int4
from compress.nn.inference import W4A16Linear, W8A8Linear

QUANT_METHOD = "compressed-tensors"
# The compressed-tensors release whose config keys and tensor names this writes (checked against it).
FORMAT_VERSION = "0.20.0"
INT_QUANTIZED, PACK_QUANTIZED = "int-quantized", "pack-quantized"
NAIVE_QUANTIZED, MIXED = "naive-quantized", "mixed-precision"
SUPPORTED = ("W8A8: int8 symmetric weights per output channel (strategy 'channel') with int8 symmetric "
             "input activations per token computed at run time (strategy 'token', dynamic) or one static "
             "scale (strategy 'tensor', input_scale), format int-quantized; W4A16: int4 symmetric weights "
             f"per group of {'/'.join(map(str, W4_GROUP_SIZES))} input channels (strategy 'group') or per "
             "output channel (strategy 'channel'), no activation quantization, format pack-quantized")
_NIBBLE_TOP_BITS = torch.tensor(0x88888888 - (1 << 32), dtype=torch.int32)  # bit 3 of each of the 8 nibbles


def _int_args(num_bits: int, strategy: str, dynamic: bool, group_size: int | None = None) -> dict:
    return {"num_bits": num_bits, "type": "int", "symmetric": True, "strategy": strategy,
            "group_size": group_size, "dynamic": dynamic}


def scheme_of(module: W8A8Linear | W4A16Linear) -> dict:
    """The config-group scheme (without ``targets``) that stores ``module``."""
    if isinstance(module, W8A8Linear):
        activations = _int_args(8, "tensor", False) if module.config.static else _int_args(8, "token", True)
        return {"format": INT_QUANTIZED, "weights": _int_args(8, "channel", False),
                "input_activations": activations, "output_activations": None}
    if module.config.group_size is None:
        weights = _int_args(4, "channel", False)
    else:
        weights = _int_args(4, "group", False, module.config.group_size)
    return {"format": PACK_QUANTIZED, "weights": weights, "input_activations": None, "output_activations": None}


def pack_offset_int4(q: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 in [-8, 7] -> compressed-tensors ``weight_packed`` (N, ceil(K/8)) int32."""
    padded = torch.nn.functional.pad(q, (0, -q.shape[1] % 8), value=-8)  # offset binary: -8 is the nibble 0
    return (pack_int4(padded.T.contiguous()) ^ _NIBBLE_TOP_BITS).T.contiguous()


def unpack_offset_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """compressed-tensors ``weight_packed`` (N, ceil(K/8)) int32 -> (N, K) int8 in [-8, 7]."""
    return unpack_int4((packed ^ _NIBBLE_TOP_BITS).T.contiguous())[:in_features].T.contiguous()


def tensors_of(module: W8A8Linear | W4A16Linear) -> dict[str, torch.Tensor]:
    """``module``'s tensors under their compressed-tensors names (relative to the layer)."""
    tensors = {} if module.bias is None else {"bias": module.bias.detach()}
    if isinstance(module, W8A8Linear):
        tensors.update(weight=module.w_q.detach(), weight_scale=module.w_scale.detach().float()[:, None])
        if module.config.static:
            tensors["input_scale"] = module.act_scale.detach().float().reshape(1)
        return tensors
    q = unpack_int4(module.qweight.detach())[: module.in_features].T  # (N, K)
    tensors.update(weight_packed=pack_offset_int4(q), weight_scale=module.scales.detach().float().T.contiguous(),
                   weight_shape=torch.tensor([module.out_features, module.in_features], dtype=torch.int64))
    return tensors


def layer_config(scheme: dict, global_format: str, where: str) -> W8A8Config | W4A16Config:
    """Our config for a layer stored with ``scheme`` (a config group of ``quantization_config``);
    CheckpointError naming ``where`` and listing what is supported for any other scheme."""
    weights, activations = _args(scheme, "weights", where), _args(scheme, "input_activations", where)
    output = scheme.get("output_activations")
    layout = scheme.get("format") or global_format
    described = (f"weights {_describe(weights)}, input activations {_describe(activations)}"
                 + (f", output activations {_describe(_args(scheme, 'output_activations', where))}" if output else "")
                 + f", format {layout!r}")
    weight_only = activations is None and output is None
    static_weights = weights is not None and weights.get("dynamic", False) is False
    if static_weights and _plain_int(weights, 8) and _strategy(weights) == "channel" and output is None \
            and activations is not None and _plain_int(activations, 8) and layout in (INT_QUANTIZED, NAIVE_QUANTIZED):
        if _strategy(activations) == "token" and activations.get("dynamic") is True:
            return W8A8Config(activation="dynamic")
        if _strategy(activations) == "tensor" and activations.get("dynamic", False) is False:
            return W8A8Config(activation="static")
    if static_weights and _plain_int(weights, 4) and weight_only and layout == PACK_QUANTIZED:
        if _strategy(weights) == "channel":
            return W4A16Config(group_size=None)
        if _strategy(weights) == "group" and weights.get("group_size") in W4_GROUP_SIZES:
            return W4A16Config(group_size=weights["group_size"])
    raise CheckpointError(f"{where}: {described} is not supported; supported: {SUPPORTED}")


def _args(scheme: dict, key: str, where: str) -> dict | None:
    args = scheme.get(key)
    if args is not None and not isinstance(args, dict):
        raise CheckpointError(f"{where}: field {key!r}: expected an object of quantization args or null, got {args!r}")
    return args


def _plain_int(args: dict, num_bits: int) -> bool:
    """Symmetric ``int`` quantization with ``num_bits`` bits, no blocks, no GPTQ group reordering (g_idx)."""
    return (args.get("type", "int") == "int" and args.get("num_bits", 8) == num_bits
            and args.get("symmetric", True) is True and args.get("block_structure") is None
            and args.get("actorder") in (None, "weight", "static"))


def _strategy(args: dict) -> str:
    """The strategy compressed-tensors infers when none is written: from ``group_size``."""
    if args.get("strategy") is not None:
        return args["strategy"]
    group_size = args.get("group_size")
    return "tensor" if group_size is None else "channel" if group_size == -1 else "group"


def _describe(args: dict | None) -> str:
    if args is None:
        return "none"
    kind = f"{args.get('type', 'int')}{args.get('num_bits', 8)}"
    symmetry = "symmetric" if args.get("symmetric", True) else "asymmetric"
    group = f" of {args['group_size']}" if _strategy(args) == "group" else ""
    timing = "dynamic" if args.get("dynamic") else "static"
    extra = f", actorder {args['actorder']!r}" if args.get("actorder") not in (None, "weight", "static") else ""
    return f"{kind} {symmetry} per {_strategy(args)}{group} ({timing}{extra})"


def module_from(config: W8A8Config | W4A16Config, tensors: dict[str, torch.Tensor], in_features: int,
                out_features: int, where: str) -> W8A8Linear | W4A16Linear:
    """Our inference module for one layer from its compressed-tensors ``tensors`` (relative names);
    CheckpointError naming ``where`` when a tensor is missing, extra, or of another shape or dtype."""
    bias = "bias" in tensors
    if isinstance(config, W8A8Config):
        expected = {"weight": ((out_features, in_features), "int8"), "weight_scale": ((out_features, 1), "float")}
        if config.static:
            expected["input_scale"] = ((1,), "float")
    else:
        groups = 1 if config.group_size is None else in_features // config.group_size
        if not config.whole_groups(in_features):
            raise CheckpointError(f"{where}: group size {config.group_size} does not divide in_features={in_features}")
        expected = {"weight_packed": ((out_features, -(-in_features // 8)), "int32"),
                    "weight_scale": ((out_features, groups), "float"), "weight_shape": ((2,), "integer")}
    if bias:
        expected["bias"] = ((out_features,), "float")
    _check_tensors(tensors, expected, where)
    if isinstance(config, W8A8Config):
        module = W8A8Linear(in_features, out_features, bias, config)
        module.w_q.copy_(tensors["weight"])
        module.w_scale.copy_(tensors["weight_scale"][:, 0].float())
        if config.static:
            module.act_scale.copy_(tensors["input_scale"].float().reshape(()))
    else:
        shape = tensors["weight_shape"].tolist()
        if shape != [out_features, in_features]:
            raise CheckpointError(f"{where}: tensor 'weight_shape' holds {shape}, "
                                  f"expected [{out_features}, {in_features}]")
        module = W4A16Linear(in_features, out_features, bias, config)
        q = unpack_offset_int4(tensors["weight_packed"], in_features)  # (N, K)
        padded = config.padded_in_features(in_features)
        module.qweight.copy_(pack_int4(torch.nn.functional.pad(q, (0, padded - in_features)).T.contiguous()))
        module.scales.copy_(tensors["weight_scale"].float().T)
    if bias:
        module.bias = tensors["bias"]
    return module


def _check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple], where: str) -> None:
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CheckpointError(f"{where}: expected the tensors {sorted(expected)}, got {sorted(tensors)}"
                              + (f" (missing {missing})" if missing else "")
                              + (f" (unexpected {extra}: not part of the supported schemes)" if extra else ""))
    for name, (shape, kind) in expected.items():
        tensor = tensors[name]
        dtype = str(tensor.dtype).removeprefix("torch.")
        good_dtype = {"float": tensor.is_floating_point(), "integer": not tensor.is_floating_point()
                      and tensor.dtype != torch.bool}.get(kind, dtype == kind)
        if tuple(tensor.shape) != shape or not good_dtype:
            raise CheckpointError(f"{where}: tensor {name!r}: expected shape {list(shape)} and dtype {kind}, "
                                  f"got shape {list(tensor.shape)} and dtype {dtype}")
        if name.endswith("_scale") and not bool(torch.isfinite(tensor).all() and (tensor > 0).all()):
            raise CheckpointError(f"{where}: tensor {name!r}: expected positive finite scales, got values in "
                                  f"[{tensor.min().item()}, {tensor.max().item()}]")
