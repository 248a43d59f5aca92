"""Typed, frozen compression configs, validated on construction.

* :class:`W8A8Config`: int8 weights (per output channel, ``s_w[n] = max|W[n,:]| / 127``) and int8
  activations, either dynamic per token (``s_x[m] = max|X[m,:]| / 127``, the default) or one
  static, calibrated per-tensor scale (``activation="static"``, found by an observer).
* :class:`W4A16Config`: int4 weights in [-8, 7], one scale per group of ``group_size`` input
  channels (``None`` means one group per output channel, ``G = K``), fp16/bf16 activations.
* :class:`W8A16Config`: int8 weights in [-128, 127], one scale per output channel
  (``s_w[n] = max|W[n,:]| / 127``, the default) or per group of 128 input channels
  (``group_size=128``), fp16/bf16 activations.
* :class:`W8A8BlockConfig`: block-scaled int8 x int8 (DeepSeek-V3 / Jetfire style): activations per
  token with one dynamic scale per 128 consecutive channels (``s_x[m, kb] = max|X[m, 128kb:128(kb+1)]| / 127``),
  weights with one scale per 128 x 128 block; both symmetric in [-127, 127].
* :class:`BlockSparseConfig`: 32x32 blocks of the weight pruned to ``sparsity`` (a fraction of
  blocks), scored by ``score``.

``learnable_scale`` turns the weight scales into parameters trained with the LSQ gradient (Esser et
al., 2020) during QAT; the exported module stores the learned scales. LSQ scales its gradient for SGD;
under Adam (the tasks' AdamW) a scale moves by up to about the learning rate per step whatever its
gradient: 150 steps at 3e-4 can move a scale by 0.045, against pretrained SmolLM2's int4 g128 scales of
0.03-0.16 (1st to 99th percentile, median 0.076). There (W4A16 g128, 150 steps from the pretrained
model) learned scales gave 18.76 / 18.56 / 25.79 perplexity at learning rates 3e-5 / 1e-4 / 3e-4, and
fixed absmax scales 18.62 at 1e-4; continuing from the fine-tuned dense model with its distillation
at 1e-4, learned scales gave 17.29 against 17.41 fixed (17.08 against 17.19 at distillation
temperature 2; 16.97 at 2e-4, 16.70 with a distillation weight of 0.75), which
recipes/smollm2-wikitext-w4a16-qat.yaml uses.

``algorithm`` (every quantization config) chooses how the weights are rounded: ``"rtn"`` (round to
nearest, the default) or ``"gptq"`` (Frantar et al., 2022: :mod:`compress.core.gptq`, run on
calibration data by :func:`compress.convert` or the ``Calibration`` callback), with its knobs
``gptq_damping`` (fraction of the Hessian's mean diagonal added to it, in (0, 1]),
``gptq_act_order`` (sweep the input channels by decreasing Hessian diagonal; None, the default: on
for dense layers, off for block-sparse ones, where the natural order compensates more of the
pruning: 0.27 against 0.78 of round-to-nearest's output error on a synthetic layer) and ``gptq_block``
(columns per lazy batch). The knobs must keep their defaults with ``"rtn"``. Each config converts to and
from a plain dict (``to_dict`` / :func:`config_from_dict`) for the checkpoint manifest, and
jsonargparse builds them from YAML mappings since they are plain dataclasses.

What a scheme means lives on its config: code elsewhere asks the config, not its type. Every config
answers every question; a config without that part answers None / False (``_ConfigMixin``):

* ``weight_bits`` and ``qmax``: 8 and 127 (W8A8, W8A16, W8A8Block), 4 and 7 (W4A16);
* ``weight_scales``: ``"channel"`` (W8A8, W8A16 without groups), ``"group"`` (W4A16, also per channel:
  one group of the whole padded row; W8A16 with groups), ``"block"`` (W8A8Block);
* ``activation_scales``: ``"token"`` (dynamic W8A8), ``"tensor"`` (static W8A8), ``"block"`` (W8A8Block);
  ``observes_activations``: W8A8 layers hold an activation observer (static scales, SmoothQuant);
* calibration: ``static``, ``smoothquant``, ``gptq``, summed up by ``needs_calibration`` (for
  :class:`BlockSparseConfig`: OBS or the activation score);
* padding: ``padded_in_features(K)``, K unless the scheme pads it (W4A16 / W8A16: to a multiple of the
  group size and of 8, ``padding(K)`` gives the group size too); ``whole_groups(K)``;
  ``layer_shape_warning(name, K, N)``: what a layer's shape costs (padding, blocks that do not tile it),
  which the recipe checks log;
* export: ``inference_module`` (W8A8Linear, W4A16Linear, W8A16Linear, W8A8BlockLinear, BSRLinear) and
  ``block_sparse_module`` (on a block-sparse layer: W8A8 BSRW8A8Linear, W4A16 BSRW4A16Linear; None
  elsewhere: the pruned blocks are zeros in the int weight). :mod:`compress.nn.inference` registers its modules here
  (:func:`register_inference_module`), so this module imports no ``nn``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Union

from compress.core import block_quant
from compress.core.quant import INT4_QMAX, INT8_QMAX
from compress.core.sparsity import TILE_ROWS

ACTIVATION_MODES = ("dynamic", "static")
OBSERVERS = ("absmax", "percentile", "moving_average")
W4_GROUP_SIZES = (32, 64, 128)
SCALE_BLOCKS = (128,)  # W8A8Block: the kernels' scale block (compress_kernels.reference.SCALE_BLOCK)
W8_GROUP_SIZES = (128,)  # W8A16: the kernel's group of input channels (compress_kernels.reference.W8A16_GROUP_SIZE)
BLOCK_SIZES = (32,)
BLOCK_SCORES = ("magnitude", "l2", "movement", "fisher")  # the scores gradual pruning computes
GRADIENT_SCORES = ("movement", "fisher")  # scores summed from gradients over training steps
CALIBRATED_SCORES = ("activation",)  # scores from calibration inputs (one-shot pruning only)
PRUNING_ALGORITHMS = ("score", "obs")  # prune the lowest-scoring blocks, or by second-order (OBS) cost
OBS_DEFAULTS = {"obs_damping": 0.01, "obs_rounds": 8}
ALGORITHMS = ("rtn", "gptq")  # how weights are rounded: to nearest, or GPTQ's error-compensating sweep
GPTQ_DEFAULTS = {"gptq_damping": 0.01, "gptq_act_order": None, "gptq_block": 128}


def _check_choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")


def _check_type(name: str, value, types: tuple) -> None:
    if isinstance(value, bool) and bool not in types:
        raise TypeError(f"{name}: expected {' or '.join(t.__name__ for t in types)}, got bool")
    if not isinstance(value, types):
        raise TypeError(f"{name}: expected {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}")


def _check_knobs_unused(config, algorithm: str, defaults: dict) -> None:
    """ValueError when ``config`` sets a knob of ``algorithm`` (away from ``defaults``) but uses another."""
    if config.algorithm == algorithm:
        return
    for knob, default in defaults.items():
        if getattr(config, knob) != default:
            raise ValueError(f"{type(config).__name__}.{knob}: only used with algorithm={algorithm!r}, got "
                             f"{knob}={getattr(config, knob)!r} with algorithm={config.algorithm!r}")


# config class -> the inference module it exports to, and (quantization configs) -> the module of a layer
# that is also block-sparse; filled by compress.nn.inference through register_inference_module.
_INFERENCE_MODULES: dict[type, type] = {}
_BLOCK_SPARSE_MODULES: dict[type, type] = {}


def register_inference_module(config_class: type, module: type, *, block_sparse: bool = False) -> None:
    """Record that ``config_class`` exports to ``module`` (``block_sparse``: on a layer that also has a
    :class:`BlockSparseConfig`); :mod:`compress.nn.inference` registers every module it defines."""
    (_BLOCK_SPARSE_MODULES if block_sparse else _INFERENCE_MODULES)[config_class] = module


def pad_in_features(in_features: int, group_size: int | None) -> tuple[int, int]:
    """(Kp, G): K padded to a multiple of 8 and of the group size (the grouped layers' rule); G = Kp
    for one group per output channel (``group_size`` None)."""
    if group_size is None:
        padded = -(-in_features // 8) * 8
        return padded, padded
    step = math.lcm(group_size, 8)
    return -(-in_features // step) * step, group_size


class _ConfigMixin:
    """What every config answers about its scheme (these defaults: a config without that part; the
    module docstring's table), and the dict round trip (``{"type": ClassName, **fields}``)."""

    weight_bits: ClassVar[Optional[int]] = None  # bits of a quantized weight
    qmax: ClassVar[Optional[int]] = None  # the largest integer of the symmetric weight grid
    observes_activations: ClassVar[bool] = False  # an activation observer: static scales, SmoothQuant

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **dataclasses.asdict(self)}

    @property
    def weight_scales(self) -> Optional[str]:
        """How the weight scales are laid out: ``"channel"`` (N,), ``"group"`` (N, Kp/G), ``"block"``
        (ceil(N/128), ceil(K/128)), or None (weights not quantized)."""
        return None

    @property
    def activation_scales(self) -> Optional[str]:
        """How activations are quantized: ``"token"`` (a dynamic scale per row), ``"tensor"`` (one
        calibrated static scale), ``"block"`` (per row and 128 channels), or None (kept in float)."""
        return None

    @property
    def static(self) -> bool:
        """Whether the activation scale is calibrated (static W8A8)."""
        return self.activation_scales == "tensor"

    @property
    def smoothquant(self) -> bool:
        """Whether SmoothQuant migrates activation outliers into the weights first (calibrated)."""
        return False

    @property
    def gptq(self) -> bool:
        """Whether GPTQ rounds the weights (on calibration inputs)."""
        return False

    @property
    def needs_calibration(self) -> bool:
        """Whether the scheme reads calibration data: static scales, SmoothQuant or GPTQ here."""
        return self.static or self.smoothquant or self.gptq

    def padded_in_features(self, in_features: int) -> int:
        """The K the layer's weight is stored with: ``in_features`` unless the scheme pads it."""
        return in_features

    def whole_groups(self, in_features: int) -> bool:
        """Whether ``in_features`` splits into whole groups (no padding to the group size); True without groups."""
        return True

    def layer_shape_warning(self, name: str, in_features: int, out_features: int) -> Optional[str]:
        """What layer ``name``'s shape costs under this scheme (logged, never refused), or None."""
        return None

    @property
    def inference_module(self) -> type:
        """The inference module (:mod:`compress.nn.inference`) a layer with this config exports to."""
        if type(self) not in _INFERENCE_MODULES:
            raise LookupError(f"{type(self).__name__}: no inference module registered (import compress.nn.inference)")
        return _INFERENCE_MODULES[type(self)]

    @property
    def block_sparse_module(self) -> Optional[type]:
        """The module of a layer both pruned (:class:`BlockSparseConfig`) and quantized with this config,
        storing the kept blocks only; None: the pruned blocks stay zeros in :attr:`inference_module`'s
        weight."""
        return _BLOCK_SPARSE_MODULES.get(type(self))


class _AlgorithmMixin:
    """``algorithm`` and the GPTQ knobs shared by the quantization configs (fields declared there)."""

    def _check_algorithm(self) -> None:
        name = type(self).__name__
        _check_choice(f"{name}.algorithm", self.algorithm, ALGORITHMS)
        _check_type(f"{name}.gptq_damping", self.gptq_damping, (int, float))
        if not 0.0 < self.gptq_damping <= 1.0:
            raise ValueError(f"{name}.gptq_damping: expected a fraction in (0, 1], got {self.gptq_damping}")
        _check_type(f"{name}.gptq_act_order", self.gptq_act_order, (bool, type(None)))
        _check_type(f"{name}.gptq_block", self.gptq_block, (int,))
        if self.gptq_block < 1:
            raise ValueError(f"{name}.gptq_block: expected a positive int, got {self.gptq_block}")
        _check_knobs_unused(self, "gptq", GPTQ_DEFAULTS)

    @property
    def gptq(self) -> bool:
        return self.algorithm == "gptq"


@dataclass(frozen=True)
class W8A8Config(_AlgorithmMixin, _ConfigMixin):
    """int8 x int8. ``activation``: ``"dynamic"`` (per token) or ``"static"`` (calibrated scale).

    ``observer`` and ``percentile`` choose how static scales are calibrated; ``smoothquant_alpha``
    (in [0, 1], or None for no migration) asks the post-training path to migrate activation
    outliers into the weights before quantizing. ``algorithm="gptq"``: GPTQ rounds the int8 weights
    (the per-row scales stay ``max|W[n,:]| / 127``).
    """

    weight_bits: ClassVar[int] = 8
    qmax: ClassVar[int] = INT8_QMAX
    observes_activations: ClassVar[bool] = True

    activation: str = "dynamic"
    observer: str = "absmax"
    percentile: float = 99.99
    smoothquant_alpha: Optional[float] = None
    learnable_scale: bool = False
    algorithm: str = "rtn"
    gptq_damping: float = 0.01
    gptq_act_order: Optional[bool] = None
    gptq_block: int = 128

    def __post_init__(self):
        _check_choice("W8A8Config.activation", self.activation, ACTIVATION_MODES)
        _check_choice("W8A8Config.observer", self.observer, OBSERVERS)
        _check_type("W8A8Config.percentile", self.percentile, (int, float))
        if not 0.0 < self.percentile <= 100.0:
            raise ValueError(f"W8A8Config.percentile: expected a value in (0, 100], got {self.percentile}")
        if self.smoothquant_alpha is not None:
            _check_type("W8A8Config.smoothquant_alpha", self.smoothquant_alpha, (int, float))
            if not 0.0 <= self.smoothquant_alpha <= 1.0:
                raise ValueError(
                    f"W8A8Config.smoothquant_alpha: expected None or a value in [0, 1], got {self.smoothquant_alpha}"
                )
        _check_type("W8A8Config.learnable_scale", self.learnable_scale, (bool,))
        self._check_algorithm()

    @property
    def weight_scales(self) -> str:
        return "channel"

    @property
    def activation_scales(self) -> str:
        return "tensor" if self.activation == "static" else "token"

    @property
    def smoothquant(self) -> bool:
        return self.smoothquant_alpha is not None


@dataclass(frozen=True)
class _WeightOnlyConfig(_AlgorithmMixin, _ConfigMixin):
    """The fields and checks W4A16 and W8A16 share: ``group_size`` (one of ``GROUP_SIZES``, or None for
    one scale per output channel), LSQ scales, and the algorithm with its GPTQ knobs."""

    GROUP_SIZES: ClassVar[tuple] = ()
    group_size: Optional[int] = None
    learnable_scale: bool = False
    algorithm: str = "rtn"
    gptq_damping: float = 0.01
    gptq_act_order: Optional[bool] = None
    gptq_block: int = 128

    def __post_init__(self):
        name = type(self).__name__
        if self.group_size is not None:
            _check_type(f"{name}.group_size", self.group_size, (int,))
            _check_choice(f"{name}.group_size", self.group_size, self.GROUP_SIZES + (None,))
        _check_type(f"{name}.learnable_scale", self.learnable_scale, (bool,))
        self._check_algorithm()

    @property
    def weight_scales(self) -> str:
        return "channel" if self.group_size is None else "group"

    def padding(self, in_features: int) -> tuple[int, int]:
        """(Kp, G): the padded K and the group size the layer's weight is quantized with (G = Kp: one
        group per output channel); K is padded with zero channels to a multiple of G and of 8."""
        return pad_in_features(in_features, self.group_size)

    def padded_in_features(self, in_features: int) -> int:
        return self.padding(in_features)[0]

    def whole_groups(self, in_features: int) -> bool:
        return self.group_size is None or in_features % self.group_size == 0

    def layer_shape_warning(self, name: str, in_features: int, out_features: int) -> Optional[str]:
        """K padded to the group size (correct, at the cost of the padding's bytes; e.g. SmolLM2's 576
        with groups of 128 pads to 640)."""
        if self.whole_groups(in_features):
            return None
        padded = self.padded_in_features(in_features)
        return (f"{type(self).__name__.removesuffix('Config')} group_size={self.group_size} does not divide "
                f"in_features={in_features} of layer {name!r}: K is padded with zero channels to {padded} "
                f"({100 * (padded / in_features - 1):.0f}% more int{self.weight_bits} weights there)")


@dataclass(frozen=True)
class W4A16Config(_WeightOnlyConfig):
    """int4 weights, fp16/bf16 activations; ``group_size`` in (32, 64, 128) or None (per channel).

    ``algorithm="gptq"``: each group's scale is searched first (a clipped absmax that minimises the
    group's rounding error weighted by the inputs' energy), then GPTQ rounds the weights on those
    scales (:mod:`compress.core.gptq`).
    """

    GROUP_SIZES: ClassVar[tuple] = W4_GROUP_SIZES
    weight_bits: ClassVar[int] = 4
    qmax: ClassVar[int] = INT4_QMAX
    group_size: Optional[int] = 128

    @property
    def weight_scales(self) -> str:
        """Always ``"group"``: per channel, W4A16 is one group of the whole (padded) row, scales (N, 1)."""
        return "group"

    def group_size_for(self, in_features: int) -> int:
        """The group size used for a layer with ``in_features`` input channels (per channel: the padded K)."""
        return self.padding(in_features)[1]


@dataclass(frozen=True)
class W8A16Config(_WeightOnlyConfig):
    """int8 weights, fp16/bf16 activations; ``group_size`` None (one scale per output channel, the
    default) or 128 (one per group of 128 input channels).

    ``algorithm="gptq"``: per channel the row scales are fixed up front (``max|W[n,:]| / 127``, as for
    W8A8); with groups each group's scale is searched when the sweep reaches it (as for W4A16); then
    GPTQ rounds the weights on those scales (:mod:`compress.core.gptq`).
    """

    GROUP_SIZES: ClassVar[tuple] = W8_GROUP_SIZES
    weight_bits: ClassVar[int] = 8
    qmax: ClassVar[int] = INT8_QMAX


@dataclass(frozen=True)
class W8A8BlockConfig(_ConfigMixin):
    """Block-scaled int8 x int8: dynamic 1 x ``block`` activation scales, ``block`` x ``block`` weight scales.

    ``block``: 128 (the kernels' step). ``learnable_scale``: the weight block scales are trained with
    the LSQ gradient during QAT. ``algorithm``: ``"rtn"`` only (GPTQ on block scales is not implemented).
    """

    weight_bits: ClassVar[int] = 8
    qmax: ClassVar[int] = block_quant.QMAX  # symmetric: [-127, 127]

    block: int = 128
    learnable_scale: bool = False
    algorithm: str = "rtn"

    def __post_init__(self):
        _check_type("W8A8BlockConfig.block", self.block, (int,))
        _check_choice("W8A8BlockConfig.block", self.block, SCALE_BLOCKS)
        _check_type("W8A8BlockConfig.learnable_scale", self.learnable_scale, (bool,))
        _check_choice("W8A8BlockConfig.algorithm", self.algorithm, ("rtn",))

    @property
    def weight_scales(self) -> str:
        return "block"

    @property
    def activation_scales(self) -> str:
        return "block"


@dataclass(frozen=True)
class BlockSparseConfig(_ConfigMixin):
    """Prune ``sparsity`` (fraction in [0, 1)) of the ``block`` x ``block`` weight blocks.

    ``algorithm="score"`` (the default) prunes the lowest-scoring blocks by ``score``: ``"magnitude"``
    (mean |w| of the block), ``"l2"`` (Frobenius norm of the block), ``"movement"`` (``-sum W * dL/dW``
    over training steps), ``"fisher"`` (the mean over steps of ``(sum over the block of W * dL/dW)^2``)
    or ``"activation"`` (mean of ``|w_ij| * ||x_j||`` over the block, ``||x_j||`` the norm of input
    channel j over the calibration data). Only gradual pruning during training,
    :class:`compress.schedule.PruningSchedule` (also inside the Lightning ``BlockPruning`` callback),
    computes the gradient scores; ``"activation"`` needs calibration data (one-shot pruning).

    ``algorithm="obs"``: second-order one-shot pruning (:mod:`compress.core.obs`) on calibration data,
    layer by layer in the forward's order: whole blocks ranked by the loss their removal adds (from the
    inverse Hessian of the layer's inputs), the kept weights of their rows updated to compensate.
    ``obs_damping`` (fraction of the Hessian's mean diagonal added to it, in (0, 1]) and ``obs_rounds``
    (selection rounds, each re-scoring after the last one's updates) are its knobs; ``score`` is not
    used and must keep its default.

    ``tile_rows`` (1, 2, 4 or 8): blocks are pruned in tiles of that many consecutive block rows x one
    block column, so every block row of a tile keeps the same block columns (1: free blocks, the
    default). It is the pattern of the large-M block-sparse kernel, whose output tiles span
    ``32 * tile_rows`` outputs: a pruned tile is a whole K step it skips. 4 is the fastest on an H200
    (50% at M = 2,048: 1.43-1.70x cuBLAS fp16 on layers from 4096x4096; 8 and 2 slower, see
    ``docs/kernels.md``).
    """

    sparsity: float = 0.5
    block: int = 32
    score: str = "magnitude"
    algorithm: str = "score"
    obs_damping: float = 0.01
    obs_rounds: int = 8
    tile_rows: int = 1

    def __post_init__(self):
        _check_type("BlockSparseConfig.sparsity", self.sparsity, (int, float))
        if not 0.0 <= self.sparsity < 1.0:
            raise ValueError(f"BlockSparseConfig.sparsity: expected a fraction in [0, 1), got {self.sparsity}")
        _check_type("BlockSparseConfig.block", self.block, (int,))
        _check_choice("BlockSparseConfig.block", self.block, BLOCK_SIZES)
        _check_choice("BlockSparseConfig.score", self.score, BLOCK_SCORES + CALIBRATED_SCORES)
        _check_choice("BlockSparseConfig.algorithm", self.algorithm, PRUNING_ALGORITHMS)
        _check_type("BlockSparseConfig.obs_damping", self.obs_damping, (int, float))
        if not 0.0 < self.obs_damping <= 1.0:
            raise ValueError(f"BlockSparseConfig.obs_damping: expected a fraction in (0, 1], got {self.obs_damping}")
        _check_type("BlockSparseConfig.obs_rounds", self.obs_rounds, (int,))
        if self.obs_rounds < 1:
            raise ValueError(f"BlockSparseConfig.obs_rounds: expected a positive int, got {self.obs_rounds}")
        if self.algorithm == "obs" and self.score != "magnitude":
            raise ValueError(f"BlockSparseConfig.score: not used with algorithm='obs' (blocks are ranked by their "
                             f"second-order cost); expected the default 'magnitude', got {self.score!r}")
        _check_knobs_unused(self, "obs", OBS_DEFAULTS)
        _check_type("BlockSparseConfig.tile_rows", self.tile_rows, (int,))
        _check_choice("BlockSparseConfig.tile_rows", self.tile_rows, TILE_ROWS)

    @property
    def needs_calibration(self) -> bool:
        """Whether pruning reads calibration inputs (OBS, or the activation score)."""
        return self.algorithm == "obs" or self.score in CALIBRATED_SCORES

    def tiles(self, out_features: int, in_features: int) -> bool:
        """Whether the ``block`` x ``block`` blocks tile an (N, K) weight; a layer they do not tile exports dense."""
        return out_features % self.block == 0 and in_features % self.block == 0

    def layer_shape_warning(self, name: str, in_features: int, out_features: int) -> Optional[str]:
        if self.tiles(out_features, in_features):
            return None
        return (f"layer {name!r} ({out_features}x{in_features}) is not a multiple of {self.block} blocks; "
                "it will export dense")


QuantConfig = Union[W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig]
QUANT_CONFIGS = (W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig)
AnyConfig = Union[W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig, BlockSparseConfig]
CONFIG_TYPES = {cls.__name__: cls for cls in (*QUANT_CONFIGS, BlockSparseConfig)}


def config_from_dict(data: dict[str, Any]) -> AnyConfig:
    """Inverse of ``config.to_dict()``."""
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"config: expected a dict with a 'type' key, got {data!r}")
    fields = dict(data)
    name = fields.pop("type")
    if name not in CONFIG_TYPES:
        raise ValueError(f"config type: expected one of {tuple(CONFIG_TYPES)}, got {name!r}")
    return CONFIG_TYPES[name](**fields)


def is_config(value) -> bool:
    return isinstance(value, (*QUANT_CONFIGS, BlockSparseConfig))
