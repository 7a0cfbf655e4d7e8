"""The synthetic cytology benchmark: cell crops from simulated microscope fields with PLANTED
acquisition signatures, so that the truth is known.

Every microscope field (the crops' parent) is rendered once as an RGB image; each cell in it
gives one ``crop_size`` x ``crop_size`` crop centred on the cell, plus the cell's own mask.
Nearby cells' crops share pixels, as in real fields.

Two things are planted, independently of each other:

- **Class = morphology only.** Cells of class k draw seven morphology features (cell size,
  elongation and outline irregularity; nucleus-to-cytoplasm ratio and nucleus elongation;
  chromatin darkness and granularity) from normal distributions whose means move along a
  severity axis: higher class index = smaller, more elongated and irregular cell, larger and
  more elongated nucleus, darker and coarser chromatin. ``class_signal`` in [0, 1] scales the
  distance between neighbouring class means: at 1 neighbouring classes are 1.89 within-class
  SDs apart on every feature (Mahalanobis distance 5.0 over the seven features), at 0 all
  classes are the same. Colour, orientation, cytoplasm stain and placement are class-free
  nuisances.
- **Field = acquisition signature.** Each field draws a signature from the named mechanisms,
  one row of draws per field from the signature stream, so it is independent of the class
  (every class draws from the same distribution). It helps a model only when the model has
  seen siblings from the same field:

  ================  =======================================================================
  ``color``         white balance (per-channel RGB gain, log-SD 0.07 s) and stain hue
                    (stain OD vectors rotated about the grey axis, SD 12 s degrees)
  ``illumination``  multiplicative ``exp(log_gain + gx x' + gy y' - v r'^2)``; log_gain SD
                    0.06 s, gradients SD 0.20 s h per field width, vignetting
                    v ~ U(0, 0.20 s h), with h = ``illumination_shading`` (default 1; 0 leaves
                    a uniform per-field gain)
  ``background``    background tint (OD, SD 0.03 s per channel), smooth mottling (OD
                    amplitude s (0.01 .. 0.04) on a grid of 4 .. 16 px) and debris specks
                    (Poisson, rate up to 30 s per field, per-field speck colour)
  ``focus``         Gaussian blur, sigma ~ U(0, 1.5 s) px
  ``noise``         a fixed sensor pattern in field coordinates: Gaussian fixed-pattern
                    noise of SD s (1 .. 6) levels with a per-field channel correlation, plus
                    banding of amplitude up to 3 s levels with per-field period and angle
  ``none``          no signature: the negative control
  ================  =======================================================================

  s is the mechanism's strength (``strength`` times its entry in ``strengths``). Pixel sizes
  are for 64 px crops and scale with ``crop_size / 64`` (a 32 px crop is the same scene at half
  the resolution). Every field also carries i.i.d. sensor noise of ``baseline_noise`` levels,
  the same in distribution for all fields.

Rendering is Beer-Lambert: optical densities of background, debris, cytoplasm and nucleus add;
the light ``white * gain * illumination * exp(-OD)`` is blurred, gets sensor noise, and is
quantised to 8 bits. Toggling a mechanism changes nothing else: cells and their placement, the
signatures, and each field's pixel noise come from separate random streams, so the same seed
with and without a mechanism gives the same cells (identical masks and table) and the same
draws for the other mechanisms.

Calibration (a 6-layer CNN of width 24 trained 40 epochs on 32 px crops, 80 fields per class,
factorial split cells leak-high vs clean-high, ~500 training and ~205 test crops, seeds 0 and
1): with every mechanism at strength 1 and ``class_signal`` 0.6 (the defaults) test accuracy
was 0.805 / 0.840 (leak) vs 0.702 / 0.738 (clean), +10 points; with ``none`` 0.873 / 0.854 vs
0.883 / 0.898. At ``class_signal`` 0.5 (seed 0) with one mechanism at a time, leak minus clean
was: color +9, background +5, noise +5, illumination +1, focus 0 points (none +2, all five
+14); illumination and focus are weak field cues at 32 px. The validity study (docs/validity.md,
"Diagnostic validity": class signal 0.4, 16 seeds) gets a leak from every mechanism alone; for
illumination only with ``illumination_shading`` 0 (one gain per field: +18 points).

Example:
    >>> from shortcutlab.synth import SynthConfig, synthesize
    >>> data = synthesize(SynthConfig(fields_per_class=2, crop_size=32, seed=1))
    >>> data.images.shape[1:], data.images.dtype, data.masks.dtype
    (torch.Size([3, 32, 32]), torch.uint8, torch.bool)
    >>> sorted(data.table.columns)
    ['h', 'id', 'label', 'parent', 'w', 'x', 'y']
"""

from __future__ import annotations

import difflib
import json
import math
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import ndimage
from scipy.special import ndtri

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import atomic_dir, claim_output_dir, read_json_object
from shortcutlab.paths import inside, wrong_kind

MECHANISMS: tuple[str, ...] = ("color", "illumination", "background", "focus", "noise")
"""Acquisition mechanisms, in the order their parameters are drawn and applied."""

NONE = "none"
ALL_CELLS_COLUMN = "all_cells_mask"
"""Manifest column of the all-cells masks (`SynthData.all_cells`), written by `write_synth`."""
FORMAT = "shortcutlab-synth"
FORMAT_VERSION = 1
_REFERENCE_CROP = 64  # pixel sizes in this module are for 64 px crops


class SynthError(ShortcutlabError):
    """Bad parameters for the synthetic benchmark, or an unreadable benchmark folder."""


# ---------------------------------------------------------------------- morphology
@dataclass(frozen=True)
class _Feature:
    name: str
    mid: float  # mean over classes
    sd: float  # within-class SD
    sign: int  # direction along the severity axis
    lo: float
    hi: float


_FEATURES: tuple[_Feature, ...] = (
    _Feature("log_cell_radius", math.log(14.0), 0.10, -1, math.log(6.0), math.log(28.0)),  # radius in 64-px-crop pixels
    _Feature("log_cell_elongation", 0.20, 0.08, +1, 0.0, 0.6),  # log(major / minor axis)
    _Feature("cell_irregularity", 0.05, 0.02, +1, 0.0, 0.2),  # RMS relative outline wobble
    _Feature("nc_ratio", 0.38, 0.05, +1, 0.15, 0.62),  # nucleus radius / cell radius
    _Feature("log_nucleus_elongation", 0.15, 0.06, +1, 0.0, 0.5),
    _Feature("chromatin", 1.0, 0.15, +1, 0.3, 2.0),  # haematoxylin concentration (OD units)
    _Feature("granularity", 0.25, 0.08, +1, 0.0, 0.7),  # relative SD of the chromatin texture
)
_FEATURE_NAMES = tuple(f.name for f in _FEATURES)
_SD = np.array([f.sd for f in _FEATURES])
_LO = np.array([f.lo for f in _FEATURES])
_HI = np.array([f.hi for f in _FEATURES])
_NEIGHBOUR_SEPARATION = 5.0 / math.sqrt(len(_FEATURES))  # SDs per feature at class_signal 1

# Optical constants (OD per unit concentration, RGB); they go to synth.json.
_WHITE = 0.82  # light through an empty, untinted field, share of 255 (headroom for gains)
_BACKGROUND_OD = (0.08, 0.08, 0.07)
_HAEMATOXYLIN = (0.65, 0.70, 0.29)
_CYTOPLASM_STAINS = ((0.50, 0.15, 0.30), (0.10, 0.50, 0.25))  # cyanophilic, eosinophilic
_CYTOPLASM_DENSITY = (0.25, 0.45)
_TEXTURE_COLOR = (0.9, 1.0, 1.1)
_DEBRIS_COLORS = ((0.55, 0.65, 0.75), (0.8, 0.8, 0.8))
_CHROMATIN_GRAIN_PX = 0.8
_HARMONICS = 4  # outline harmonics 2 .. 5

# 256 quantiles of the standard normal, rescaled to unit variance: Gaussian noise from random
# bytes at a fifth of the cost of `standard_normal` (the image is quantised to 8 bits anyway).
_GAUSS = ndtri((np.arange(256) + 0.5) / 256.0)
_GAUSS = (_GAUSS / _GAUSS.std()).astype(np.float32)


def _gauss(rng: np.random.Generator, shape, sd: float = 1.0, mean: float = 0.0) -> np.ndarray:
    """float32 Gaussian noise (256-level quantiles) of SD `sd` around `mean`."""
    n = int(np.prod(shape))
    raw = rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n]
    lut = _GAUSS if (sd, mean) == (1.0, 0.0) else (_GAUSS * np.float32(sd) + np.float32(mean)).astype(np.float32)
    return np.take(lut, raw).reshape(shape)


# ---------------------------------------------------------------------- configuration
def _bad(name: str, expected: str, got: Any) -> SynthError:
    return SynthError(f"The {name!r} parameter of SynthConfig must be {expected}. Got {got!r} instead.")


def _as_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise _bad(name, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""), value)
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise _bad(name, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""), value)
    return value


def _as_float(name: str, value: Any, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if isinstance(value, bool) or not math.isfinite(v) or v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
        rng = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        raise _bad(name, f"a finite number {rng}", value)
    return v


def _unknown_mechanism(name: str) -> SynthError:
    valid = MECHANISMS + (NONE,)
    close = difflib.get_close_matches(name, valid, n=2)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return SynthError(f"unknown mechanism {name!r}{hint} Valid mechanisms: {', '.join(valid)}")


def _normalise_mechanisms(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",")]
    elif isinstance(value, Sequence):
        names = [str(v).strip() for v in value]
    else:
        raise _bad("mechanisms", "a tuple of mechanism names or ('none',)", value)
    names = [n.lower() for n in names if n]
    if not names:
        raise SynthError(f"give at least one mechanism, or 'none' for signature-free fields; valid: {', '.join(MECHANISMS)}")
    for n in names:
        if n not in MECHANISMS and n != NONE:
            raise _unknown_mechanism(n)
    if NONE in names:
        if len(set(names)) > 1:
            others = ", ".join(sorted(set(names) - {NONE}, key=MECHANISMS.index))
            raise SynthError(f"mechanism 'none' (signature-free fields) cannot be combined with other mechanisms; got none with {others}")
        return (NONE,)
    return tuple(m for m in MECHANISMS if m in names)


@dataclass(frozen=True)
class SynthConfig:
    """Every parameter that generates a synthetic benchmark (recorded in synth.json).

    Attributes:
        seed: random seed (integer >= 0); the same config gives identical pixels and files.
        n_classes: number of classes (2 .. 26), labelled 'class0', 'class1', ...
        fields_per_class: fields whose dominant class is each class; there are
            ``n_classes * fields_per_class`` fields.
        mean_cells_per_field: mean cells (= crops) per field; a field holds 2 + Poisson(mean - 2)
            cells, so every crop has at least one sibling.
        crop_size: side of the square crops in pixels (>= 8).
        field_size: side of the square field in pixels; default ``3 * crop_size``. Cell centres
            lie at least ``crop_size / 2`` from the border, so every crop lies inside its field.
        mechanisms: names from `MECHANISMS`, or ``('none',)``; a comma-separated string is
            accepted. Stored in the canonical order of `MECHANISMS`.
        strength: multiplier of every mechanism's magnitudes (0 switches them off).
        strengths: optional per-mechanism multipliers on top of `strength`, as a mapping or
            (name, value) pairs; stored as sorted pairs.
        class_signal: distance of neighbouring class means relative to the within-class spread,
            in [0, 1] (0: classes identical, 1: 1.89 SD apart on each of seven features).
        mixed_fields: CRIC-like fields whose cells draw their class from a per-field class mix,
            instead of SIPaKMeD-like single-class fields.
        mix_dominance: with mixed fields, the weight of the field's dominant class in its class
            mix; the rest is a flat Dirichlet draw over all classes.
        baseline_noise: SD in 8-bit levels of i.i.d. sensor noise present in every field.
        illumination_shading: multiplier of the illumination's position-dependent part (gradient
            and vignetting) relative to its gain, in [0, 10]. At the default 1 a 32 px crop of a
            128 px field sees a brightness that depends on where the crop lies about as much as
            on which field it comes from; 0 gives every field one uniform gain (a lamp or
            exposure setting), which a model can learn as a field cue. Left out of `to_dict`
            at its default, so configs and task ids from before it existed are unchanged.

    Raises:
        SynthError: naming the parameter, what it must be, and what came.
    """

    seed: int = 0
    n_classes: int = 3
    fields_per_class: int = 50
    mean_cells_per_field: float = 6.0
    crop_size: int = 64
    field_size: int | None = None
    mechanisms: tuple[str, ...] = MECHANISMS
    strength: float = 1.0
    strengths: tuple[tuple[str, float], ...] = ()
    class_signal: float = 0.6
    mixed_fields: bool = False
    mix_dominance: float = 0.5
    baseline_noise: float = 2.0
    illumination_shading: float = 1.0

    def __post_init__(self) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        put("seed", _as_int("seed", self.seed, 0, 2**63 - 1))
        put("n_classes", _as_int("n_classes", self.n_classes, 2, 26))
        put("fields_per_class", _as_int("fields_per_class", self.fields_per_class, 1))
        put("mean_cells_per_field", _as_float("mean_cells_per_field", self.mean_cells_per_field, 2.0, 200.0))
        put("crop_size", _as_int("crop_size", self.crop_size, 8, 1024))
        fs = 3 * self.crop_size if self.field_size is None else self.field_size
        if isinstance(fs, (int, np.integer)) and not isinstance(fs, bool) and fs < 2 * self.crop_size:
            raise _bad("field_size", f"an integer >= 2 * crop_size = {2 * self.crop_size} (cells need room around their crops)", fs)
        put("field_size", _as_int("field_size", fs, 2 * self.crop_size, 16384))
        mechanisms = _normalise_mechanisms(self.mechanisms)
        put("mechanisms", mechanisms)
        put("strength", _as_float("strength", self.strength, 0.0, 100.0))
        raw = dict(self.strengths.items()) if isinstance(self.strengths, Mapping) else dict(self.strengths or ())
        pairs = []
        for name, value in raw.items():
            name = str(name).strip().lower()
            if name not in MECHANISMS:
                raise _unknown_mechanism(name)
            if name not in mechanisms:
                raise SynthError(
                    f"strengths names mechanism {name!r}, which is not among the mechanisms ({', '.join(mechanisms)})"
                )
            pairs.append((name, _as_float(f"strengths[{name!r}]", value, 0.0, 100.0)))
        put("strengths", tuple(sorted(pairs, key=lambda p: MECHANISMS.index(p[0]))))
        put("class_signal", _as_float("class_signal", self.class_signal, 0.0, 1.0))
        if not isinstance(self.mixed_fields, (bool, np.bool_)):
            raise _bad("mixed_fields", "True or False", self.mixed_fields)
        put("mixed_fields", bool(self.mixed_fields))
        put("mix_dominance", _as_float("mix_dominance", self.mix_dominance, 0.0, 1.0))
        put("baseline_noise", _as_float("baseline_noise", self.baseline_noise, 0.0, 64.0))
        put("illumination_shading", _as_float("illumination_shading", self.illumination_shading, 0.0, 10.0))

    @property
    def n_fields(self) -> int:
        return self.n_classes * self.fields_per_class

    @property
    def scale(self) -> float:
        """Pixel scale of the scene: ``crop_size / 64``."""
        return self.crop_size / _REFERENCE_CROP

    @property
    def effective_strengths(self) -> dict[str, float]:
        """Strength s of every mechanism (0 for those not planted)."""
        per = dict(self.strengths)
        return {m: (self.strength * per.get(m, 1.0) if m in self.mechanisms else 0.0) for m in MECHANISMS}

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(f"class{k}" for k in range(self.n_classes))

    def to_dict(self) -> dict:
        """Plain JSON-ready parameters (``SynthConfig(**d)`` rebuilds an equal config)."""
        d = asdict(self)
        d["mechanisms"] = list(self.mechanisms)
        d["strengths"] = {k: v for k, v in self.strengths}
        if d["illumination_shading"] == 1.0:  # the default before the option existed: same dict, same task ids
            del d["illumination_shading"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "SynthConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SynthError(f"unknown SynthConfig parameters {unknown}; known: {', '.join(sorted(known))}")
        return cls(**dict(d))


def parse_mechanisms(text: str) -> tuple[tuple[str, ...], dict[str, float]]:
    """Parse the command-line form ``NAME[=STRENGTH][,NAME[=STRENGTH]...]`` or ``none``.

    Returns:
        (names, per-mechanism strengths) for `SynthConfig`'s `mechanisms` and `strengths`.

    Example:
        >>> parse_mechanisms("color=2,noise")
        (('color', 'noise'), {'color': 2.0})
    """
    names, strengths = [], {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        name, _, value = part.partition("=")
        name = name.strip().lower()
        names.append(name)
        if value.strip():
            try:
                strengths[name] = float(value)
            except ValueError:
                raise SynthError(f"mechanism strength must be a number, got {part!r} (expected NAME=STRENGTH, e.g. color=1.5)") from None
    mechanisms = _normalise_mechanisms(names)
    return mechanisms, strengths


# ---------------------------------------------------------------------- drawing (no pixels)
def _rng(config: SynthConfig, stream: int, index: int) -> np.random.Generator:
    """Independent random stream per purpose (and per field for pixel noise): planting or
    dropping one mechanism moves no other draw."""
    return np.random.default_rng([config.seed, stream, index])


_LAYOUT, _SIGNATURE, _CHROMATIN, _BACKGROUND, _PATTERN, _BASELINE = range(6)


def class_means(config: SynthConfig) -> np.ndarray:
    """(n_classes, 7) planted class means of the morphology features (see `_FEATURES`)."""
    k = np.arange(config.n_classes) - (config.n_classes - 1) / 2.0
    mid = np.array([f.mid for f in _FEATURES])
    step = np.array([f.sign * f.sd * _NEIGHBOUR_SEPARATION for f in _FEATURES])
    mu = mid + config.class_signal * step * k[:, None]
    return np.clip(mu, _LO, _HI)


def _r6(x) -> Any:
    """Round to 6 decimals: synth.json then holds exactly what was rendered."""
    if np.ndim(x):
        return [round(float(v), 6) for v in np.ravel(x)]
    return round(float(x), 6)


def _signatures(config: SynthConfig) -> list[dict]:
    """Every field's signature as plain numbers (identity values for mechanisms not planted).

    One fixed block of 22 uniforms per field from the signature stream, whatever the
    mechanisms: planting or dropping a mechanism changes no other draw. Values are rounded to
    6 decimals before use, so synth.json holds exactly what was rendered.
    """
    F = config.n_fields
    u = _rng(config, _SIGNATURE, 0).random((F, 22))
    z = ndtri(np.clip(u[:, :10], 1e-12, 1 - 1e-12))  # standard normals
    s = config.effective_strengths
    f = config.scale
    sc, si, sb, sn = s["color"], s["illumination"], s["background"], s["noise"]
    sh = si * config.illumination_shading
    r6 = lambda a: np.round(a, 6).tolist()  # noqa: E731
    gain = r6(np.exp(0.07 * sc * z[:, 0:3]))
    rot = r6(12.0 * sc * z[:, 3])
    log_gain, gx, gy = r6(0.06 * si * z[:, 4]), r6(0.20 * sh * z[:, 5]), r6(0.20 * sh * z[:, 6])
    vig = r6(0.20 * sh * u[:, 10])
    tint = r6(0.03 * sb * z[:, 7:10])
    tex_od, tex_scale = r6(sb * (0.01 + 0.03 * u[:, 11])), r6((4.0 + 12.0 * u[:, 12]) * f)
    debris, debris_mix = r6(30.0 * sb * u[:, 13]), r6(u[:, 14])
    sigma = r6(1.5 * s["focus"] * u[:, 15] * f)
    amp, rho = r6(sn * (1.0 + 5.0 * u[:, 16])), r6(u[:, 17])
    band, period = r6(3.0 * sn * u[:, 18]), r6(np.maximum((4.0 + 12.0 * u[:, 19]) * f, 2.0))
    angle, phase = r6(180.0 * u[:, 20]), r6(2.0 * math.pi * u[:, 21])
    return [
        {
            "color": {"rgb_gain": gain[i], "stain_rotation_deg": rot[i]},
            "illumination": {"log_gain": log_gain[i], "gradient_x": gx[i], "gradient_y": gy[i], "vignetting": vig[i]},
            "background": {
                "tint_od": tint[i],
                "texture_od": tex_od[i],
                "texture_scale_px": tex_scale[i],
                "debris_rate": debris[i],
                "debris_color_mix": debris_mix[i],
            },
            "focus": {"sigma_px": sigma[i]},
            "noise": {
                "amplitude_levels": amp[i],
                "channel_correlation": rho[i],
                "banding_levels": band[i],
                "banding_period_px": period[i],
                "banding_angle_deg": angle[i],
                "banding_phase": phase[i],
            },
        }
        for i in range(F)
    ]


@dataclass
class _FieldPlan:
    index: int
    dominant: int
    mix: np.ndarray  # (K,) class mix
    label: np.ndarray  # (n,) class index per cell
    cx: np.ndarray  # (n,) int centre in field pixels
    cy: np.ndarray
    feat: np.ndarray  # (n, 7) realised features
    radius: np.ndarray  # (n,) px
    aspect: np.ndarray
    coef: np.ndarray  # (n, 4) complex outline harmonics
    nuc_radius: np.ndarray
    nuc_aspect: np.ndarray
    nuc_coef: np.ndarray
    theta: np.ndarray
    nuc_theta: np.ndarray
    nuc_dx: np.ndarray
    nuc_dy: np.ndarray
    cyto_mix: np.ndarray
    cyto_density: np.ndarray
    extent: np.ndarray  # (n,) max distance of the outline from the centre, px
    nuc_extent: np.ndarray  # (n,) max distance of the nucleus outline from the cell centre, px
    texture_at: np.ndarray  # (n, 2) uniforms: where the nucleus takes its chromatin texture
    signature: dict


_ANGLES = np.linspace(0.0, 2.0 * np.pi, 96, endpoint=False)
_ORDERS = np.arange(2, 2 + _HARMONICS)
_BASIS = np.exp(1j * _ORDERS[:, None] * _ANGLES[None, :])  # (4, 96)


def _outline(z: np.ndarray, u: np.ndarray, irregularity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outline harmonics 2..5 with RMS relative wobble `irregularity`, from (n, 4) standard
    normals `z` and uniforms `u` (phases). Returns (n, 4) complex coefficients and the minimum
    and maximum of the radius factor ``1 + wobble`` over the angle."""
    c = z / _ORDERS
    rms = np.sqrt((c * c).sum(axis=1) / 2.0)
    coef = (c * (irregularity / np.maximum(rms, 1e-12))[:, None]) * np.exp(2j * np.pi * u)
    factor = np.maximum(1.0 + np.einsum("nk,ka->na", coef.real, _BASIS.real) - np.einsum("nk,ka->na", coef.imag, _BASIS.imag), 0.5)
    return coef, factor.min(axis=1), factor.max(axis=1)


def _plan(config: SynthConfig) -> list[_FieldPlan]:
    """Draw every field's cells (class, morphology, placement) and signature; no pixels.

    Vectorised over all cells of all fields, from the layout stream, in a fixed order (cell
    counts and classes, morphology, candidate centres: reordering the draws would change
    every benchmark); signatures come from their own stream (`_signatures`).
    """
    r = _rng(config, _LAYOUT, 0)
    dominant, counts, mix, label = _plan_classes(r, config)
    start = np.concatenate([[0], np.cumsum(counts)])
    field_of = np.repeat(np.arange(config.n_fields), counts)
    m = _plan_morphology(r, config, label)
    cx, cy = _plan_placement(r, config, counts, start, field_of, m["extent"])

    signatures = _signatures(config)
    z, v, off, off_angle, theta = m["z"], m["v"], m["off"], m["off_angle"], m["theta"]
    cyto_density = _CYTOPLASM_DENSITY[0] + (_CYTOPLASM_DENSITY[1] - _CYTOPLASM_DENSITY[0]) * v[:, 4]
    plans = []
    for i in range(config.n_fields):
        s = slice(start[i], start[i + 1])
        plans.append(
            _FieldPlan(
                index=i, dominant=int(dominant[i]), mix=mix[i], label=label[s], cx=cx[s], cy=cy[s], feat=m["feat"][s],
                radius=m["radius"][s], aspect=m["aspect"][s], coef=m["coef"][s], nuc_radius=m["nuc_radius"][s],
                nuc_aspect=m["nuc_aspect"][s], nuc_coef=m["nuc_coef"][s], theta=theta[s], nuc_theta=theta[s] + 0.6 * z[s, -1],
                nuc_dx=off[s] * np.cos(off_angle[s]), nuc_dy=off[s] * np.sin(off_angle[s]),
                cyto_mix=v[s, 3], cyto_density=cyto_density[s], extent=m["extent"][s], nuc_extent=off[s] + m["nuc_ext0"][s],
                texture_at=v[s, 5:7], signature=signatures[i],
            )
        )
    return plans


def _plan_classes(r: np.random.Generator, config: SynthConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F,) dominant class and cell count of every field, (F, K) class mixes and the (N,)
    class of every cell (drawn from the field's mix with mixed fields)."""
    K, F = config.n_classes, config.n_fields
    dominant = np.arange(F) // config.fields_per_class
    counts = 2 + r.poisson(config.mean_cells_per_field - 2.0, size=F)
    N = int(counts.sum())
    field_of = np.repeat(np.arange(F), counts)
    if config.mixed_fields:
        mix = config.mix_dominance * np.eye(K)[dominant] + (1.0 - config.mix_dominance) * r.dirichlet(np.ones(K), size=F)
        mix /= mix.sum(axis=1, keepdims=True)
        cum = np.cumsum(mix, axis=1)[field_of]
        label = np.minimum((r.random(N)[:, None] >= cum).sum(axis=1), K - 1)
    else:
        mix = np.eye(K)[dominant]
        label = dominant[field_of]
    return dominant, counts, mix, label


def _plan_morphology(r: np.random.Generator, config: SynthConfig, label: np.ndarray) -> dict[str, np.ndarray]:
    """Every cell's realised features and shape (outline, nucleus), as per-cell arrays by
    name, plus the raw draws ``z`` (normals) and ``v`` (uniforms) that `_plan` still reads."""
    f, c, N = config.scale, config.crop_size, len(label)
    D = len(_FEATURES)
    z = r.standard_normal((N, D + 2 * _HARMONICS + 1))
    u = r.random((N, 2 * _HARMONICS + 7))
    feat = np.clip(class_means(config)[label] + _SD * z[:, :D], _LO, _HI)
    lrad, lel, irr, nc, lnel = feat[:, 0], feat[:, 1], feat[:, 2], feat[:, 3], feat[:, 4]

    hs_max = (c - 1) // 2
    aspect = np.exp(lel)
    coef, fmin, fmax = _outline(z[:, D : D + _HARMONICS], u[:, :_HARMONICS], irr)
    # Keep the outline (plus its anti-aliased edge) inside the crop.
    radius = np.minimum(np.exp(lrad) * f, (hs_max - 1.5) / (np.sqrt(aspect) * fmax))
    nuc_aspect = np.exp(lnel)
    nuc_coef, nfmin, nfmax = _outline(z[:, D + _HARMONICS : D + 2 * _HARMONICS], u[:, _HARMONICS : 2 * _HARMONICS], 0.5 * irr)
    room = 0.85 * radius / np.sqrt(aspect) * fmin  # inside the cell's inscribed circle
    nuc_radius = np.minimum(nc * radius, room / (np.sqrt(nuc_aspect) * nfmax))
    nuc_ext0 = nuc_radius * np.sqrt(nuc_aspect) * nfmax
    v = u[:, 2 * _HARMONICS :]
    off = 0.25 * v[:, 0] * np.maximum(room - nuc_ext0, 0.0)
    off_angle = 2.0 * np.pi * v[:, 1]
    theta = np.pi * v[:, 2]
    feat[:, 0] = np.log(radius / f)
    feat[:, 3] = nuc_radius / radius
    extent = radius * np.sqrt(aspect) * fmax
    return {"z": z, "v": v, "feat": feat, "aspect": aspect, "coef": coef, "radius": radius, "nuc_aspect": nuc_aspect,
            "nuc_coef": nuc_coef, "nuc_radius": nuc_radius, "nuc_ext0": nuc_ext0, "off": off, "off_angle": off_angle,
            "theta": theta, "extent": extent}


def _plan_placement(r: np.random.Generator, config: SynthConfig, counts: np.ndarray, start: np.ndarray,
                    field_of: np.ndarray, extent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N,) integer centres cx, cy of every cell in its field's pixels.

    The cells of every field are placed one slot at a time: each takes the first of 24
    candidate centres far enough from the cells placed before it, else the one farthest from
    them.
    """
    c, F, N = config.crop_size, config.n_fields, len(field_of)
    lo, hi = c // 2, config.field_size - c + c // 2
    cand = r.integers(lo, hi + 1, size=(N, 24, 2))
    M = int(counts.max())
    pos = np.zeros((F, M, 2), dtype=np.int64)
    ext = np.zeros((F, M))
    for j in range(M):
        fs = np.flatnonzero(counts > j)
        gi = start[fs] + j
        C = cand[gi]
        pick = np.zeros(len(fs), dtype=np.int64)
        if j:
            P = pos[fs, :j]
            d = np.hypot(C[:, :, None, 0] - P[:, None, :, 0], C[:, :, None, 1] - P[:, None, :, 1])
            ratio = (d / (0.8 * (extent[gi][:, None, None] + ext[fs][:, None, :j]))).min(axis=2)
            ok = ratio >= 1.0
            pick = np.where(ok.any(axis=1), ok.argmax(axis=1), ratio.argmax(axis=1))
        pos[fs, j] = C[np.arange(len(fs)), pick]
        ext[fs, j] = extent[gi]
    slot = np.arange(N) - start[field_of]
    return pos[field_of, slot, 0], pos[field_of, slot, 1]


# ---------------------------------------------------------------------- rendering
def _shape_alpha(hs: int, dx, dy, radius, aspect, theta, coef) -> np.ndarray:
    """(n, 2hs+1, 2hs+1) float32 coverage in [0, 1] of n star-shaped ellipses on patches centred
    on the cell centre (offset by dx, dy); a pixel is inside (mask) where coverage > 0.5.

    Outline radius ``radius * (1 + Re(sum_k coef_k e^(i k phi)))`` in the frame of the ellipse
    (major axis at angle theta, axis ratio `aspect`), with a one-pixel anti-aliased edge.
    """
    g = np.arange(-hs, hs + 1, dtype=np.float32)
    col = lambda a: np.asarray(a, dtype=np.float32)[:, None, None]  # noqa: E731
    X = g[None, None, :] - col(dx)
    Y = g[None, :, None] - col(dy)
    ct, st, sa = col(np.cos(theta)), col(np.sin(theta)), col(np.sqrt(aspect))
    u = X * ct + Y * st
    u /= sa
    v = Y * ct - X * st
    v *= sa
    rho = np.sqrt(u * u + v * v)  # np.hypot is several times slower for float32
    inv = 1.0 / np.maximum(rho, np.float32(1e-6))
    z = np.empty(u.shape, dtype=np.complex64)
    np.multiply(u, inv, out=z.real)
    np.multiply(v, inv, out=z.imag)
    a = coef.astype(np.complex64)[:, :, None, None]
    p = a[:, 3] * z  # Horner in z = e^(i phi): z^2 (a2 + z (a3 + z (a4 + z a5)))
    for k in (2, 1, 0):
        p += a[:, k]
        p *= z
    p *= z
    w = np.add(p.real, np.float32(1.0))  # contiguous copy of the radius factor
    np.maximum(w, np.float32(0.5), out=w)
    w *= col(radius)
    w -= rho
    w += np.float32(0.5)
    return np.clip(w, 0.0, 1.0, out=w)


def _rotate_stain(vectors: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate OD vectors about the grey axis (a hue shift of the stain), keeping them >= 0."""
    if degrees == 0.0:
        return vectors
    k = np.ones(3) / math.sqrt(3.0)
    t = math.radians(degrees)
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    R = np.eye(3) + math.sin(t) * K + (1 - math.cos(t)) * (K @ K)
    return np.clip(vectors @ R.T, 0.0, None)


def _smooth_field(rng: np.random.Generator, size: int, scale: float) -> np.ndarray:
    """(size, size) smooth random field of unit variance and correlation length ~ `scale` px:
    white noise on a grid of spacing `scale`, interpolated with Gaussian weights (SD 0.55
    scale) over the 3 nearest nodes per axis (gathers, not a matrix product, which would start
    BLAS threads)."""
    nodes = int(math.ceil(size / scale)) + 3
    px = np.arange(size) + 0.5
    idx = np.rint(px / scale).astype(np.int64)[:, None] + np.arange(3)[None, :]  # node k at (k - 1) scale
    w = np.exp(-0.5 * ((px[:, None] - (idx - 1) * scale) / (0.55 * scale)) ** 2)
    w = (w / np.sqrt((w * w).sum(axis=1, keepdims=True))).astype(np.float32)
    noise = rng.standard_normal((nodes, nodes), dtype=np.float32)
    rows = noise[:, idx[:, 0]] * w[:, 0]  # (nodes, size)
    for t in (1, 2):
        rows += noise[:, idx[:, t]] * w[:, t]
    out = rows[idx[:, 0], :] * w[:, 0, None]  # (size, size)
    for t in (1, 2):
        out += rows[idx[:, t], :] * w[:, t, None]
    return out


def _texture_sheet(config: SynthConfig) -> np.ndarray:
    """(S, S) chromatin texture of unit SD (white noise blurred at the chromatin grain); every
    nucleus takes a window of it at a random place (its own stream would cost more)."""
    S = max(4 * config.crop_size, 64)
    noise = _rng(config, _CHROMATIN, 0).standard_normal((S, S), dtype=np.float32)
    sheet = ndimage.gaussian_filter(noise, _CHROMATIN_GRAIN_PX * config.scale, mode="wrap", truncate=3.0)
    return sheet / sheet.std()


def _bucket(half: np.ndarray, cap) -> np.ndarray:
    """Half-sizes rounded up to a multiple of 4 (fewer, larger batches), at most `cap`."""
    return np.minimum(-(-np.ceil(half).astype(np.int64) // 4) * 4, cap)


def _cell_layers(config: SynthConfig, plans: Sequence[_FieldPlan], sheet: np.ndarray) -> list[list[tuple]]:
    """Per field, per cell: (hs, coverage (P, P), hn, nucleus concentration (Pn, Pn)), P = 2 hs + 1.

    Cells of several fields are batched by patch size, so the work scales with the cells' own
    areas and not with the largest cell of a field.
    """
    cat = lambda name: np.concatenate([getattr(p, name) for p in plans])  # noqa: E731
    hs_max = (config.crop_size - 1) // 2
    hs = _bucket(cat("extent") + 1.5, hs_max)
    hn = np.minimum(_bucket(cat("nuc_extent") + 1.5, hs_max), hs)
    radius, aspect, theta, coef = cat("radius"), cat("aspect"), cat("theta"), cat("coef")
    nr, na, nt, nc = cat("nuc_radius"), cat("nuc_aspect"), cat("nuc_theta"), cat("nuc_coef")
    ndx, ndy, feat, at = cat("nuc_dx"), cat("nuc_dy"), cat("feat"), cat("texture_at")
    n = len(hs)
    cover: list = [None] * n
    nucleus: list = [None] * n
    for B in np.unique(hs):
        idx = np.flatnonzero(hs == B)
        z0 = np.zeros(len(idx))
        A = _shape_alpha(int(B), z0, z0, radius[idx], aspect[idx], theta[idx], coef[idx])
        for i, j in enumerate(idx):
            cover[j] = A[i]
    S = sheet.shape[0]
    for B in np.unique(hn):
        idx = np.flatnonzero(hn == B)
        P = 2 * int(B) + 1
        Nu = _shape_alpha(int(B), ndx[idx], ndy[idx], nr[idx], na[idx], nt[idx], nc[idx])
        oy = (at[idx, 0] * (S - P + 1)).astype(np.int64)
        ox = (at[idx, 1] * (S - P + 1)).astype(np.int64)
        g = np.arange(P)
        tex = sheet[(oy[:, None] + g)[:, :, None], (ox[:, None] + g)[:, None, :]]
        chrom = feat[idx, 5].astype(np.float32)[:, None, None]
        gran = feat[idx, 6].astype(np.float32)[:, None, None]
        tex *= gran
        tex += np.float32(1.0)
        np.maximum(tex, np.float32(0.1), out=tex)
        tex *= chrom
        Nu *= tex
        for i, j in enumerate(idx):
            c0 = int(hs[j] - B)
            Nu[i] *= cover[j][c0 : c0 + P, c0 : c0 + P]  # the nucleus stays inside its cell
            nucleus[j] = Nu[i]
    out, k = [], 0
    for p in plans:
        m = len(p.cx)
        out.append([(int(hs[j]), cover[j], int(hn[j]), nucleus[j]) for j in range(k, k + m)])
        k += m
    return out


def _render_field(config: SynthConfig, plan: _FieldPlan, layers: list[tuple], want_labels: bool = False):
    """Render one field from its plan and its cells' layers (`_cell_layers`).

    The steps, each in place on one planar (3, H, W) float32 array (numpy broadcasts over a
    trailing axis of 3 slowly): background (`_field_background`), cells (`_paint_cells`),
    illumination (`_illumination`), then light, focus blur and sensor noise
    (`_sensor_noise`).

    Returns (rgb (3, H, W) uint8, label map (H, W) int32 or None).
    """
    sig = plan.signature
    s = config.effective_strengths
    lum = _field_background(config, plan, s["background"] > 0)
    labels = _paint_cells(lum, plan, layers, want_labels)
    if s["illumination"] > 0:
        lum += _illumination(sig["illumination"], config.field_size)
    img = np.exp(lum, out=lum)
    sigma = sig["focus"]["sigma_px"]
    if sigma > 0:
        img = ndimage.gaussian_filter(img, (0.0, sigma, sigma), truncate=3.0, mode="reflect")
    H = W = config.field_size
    # Sensor noise; the 0.5 makes the final truncation a rounding.
    img += _gauss(_rng(config, _BASELINE, plan.index), (3, H, W), config.baseline_noise, 0.5)
    if s["noise"] > 0:
        _sensor_noise(img, _rng(config, _PATTERN, plan.index), sig["noise"])
    np.clip(img, 0.0, 255.0, out=img)
    return img.astype(np.uint8), labels


def _field_background(config: SynthConfig, plan: _FieldPlan, textured: bool) -> np.ndarray:
    """(3, H, W) float32 `lum` of the empty field: the log of the light reaching the sensor, in
    8-bit levels, log(255 white gain) - OD, so the exponential at the end gives 255 white gain
    light exp(-OD); with `textured`, the background mechanism's texture and debris."""
    H = W = config.field_size
    sig = plan.signature
    gain = 255.0 * _WHITE * np.asarray(sig["color"]["rgb_gain"])
    bg_od = np.maximum(np.asarray(_BACKGROUND_OD) + np.asarray(sig["background"]["tint_od"]), 0.0)
    lum = np.empty((3, H, W), dtype=np.float32)
    lum[:] = (np.log(gain) - bg_od).astype(np.float32)[:, None, None]
    if textured:
        bg = sig["background"]
        rb = _rng(config, _BACKGROUND, plan.index)
        tex = _smooth_field(rb, H, bg["texture_scale_px"])
        for ch, weight in enumerate(_TEXTURE_COLOR):
            lum[ch] -= tex * np.float32(weight * bg["texture_od"])
        _add_debris(lum, rb, bg, config.scale)
    return lum


def _add_debris(lum: np.ndarray, rb: np.random.Generator, bg: dict, f: float) -> None:
    """Subtract Poisson(debris_rate) Gaussian specks of debris colour from `lum` (3, H, W), in
    place, drawing from the background stream `rb` after its texture."""
    _, H, W = lum.shape
    k = int(rb.poisson(bg["debris_rate"]))
    if not k:
        return
    ps = max(int(math.ceil(3.0 * 1.8 * f)), 1)
    g = np.arange(-ps, ps + 1, dtype=np.float32)
    px = rb.integers(ps, W - ps, size=k)
    py = rb.integers(ps, H - ps, size=k)
    frac = rb.random((k, 2)).astype(np.float32) - 0.5
    rad = (rb.uniform(0.5, 1.8, k) * f).astype(np.float32)
    amp = rb.uniform(0.3, 1.2, k).astype(np.float32)
    mix = bg["debris_color_mix"]
    color = ((1 - mix) * np.asarray(_DEBRIS_COLORS[0]) + mix * np.asarray(_DEBRIS_COLORS[1])).astype(np.float32)
    d2 = (g[None, None, :] - frac[:, 0, None, None]) ** 2 + (g[None, :, None] - frac[:, 1, None, None]) ** 2
    blob = amp[:, None, None] * np.exp(-0.5 * d2 / rad[:, None, None] ** 2)
    specks = color[None, :, None, None] * blob[:, None]
    for i in range(k):
        lum[:, py[i] - ps : py[i] + ps + 1, px[i] - ps : px[i] + ps + 1] -= specks[i]


def _paint_cells(lum: np.ndarray, plan: _FieldPlan, layers: list[tuple], want_labels: bool) -> np.ndarray | None:
    """Subtract every cell's cytoplasm and nucleus optical density from `lum`, in place, in
    the stain colours rotated by the field's colour signature; return the (H, W) int32 label
    map (j + 1 on cell j's mask, later cells win) or None."""
    _, H, W = lum.shape
    rot = plan.signature["color"]["stain_rotation_deg"]
    haem = _rotate_stain(np.asarray(_HAEMATOXYLIN, dtype=np.float64), rot).astype(np.float32)[:, None, None]
    cyto = _rotate_stain(np.asarray(_CYTOPLASM_STAINS, dtype=np.float64), rot)
    cyto_vec = ((1 - plan.cyto_mix)[:, None] * cyto[0] + plan.cyto_mix[:, None] * cyto[1]) * plan.cyto_density[:, None]
    cyto_vec = cyto_vec.astype(np.float32)[:, :, None, None]
    labels = np.zeros((H, W), dtype=np.int32) if want_labels else None
    for j, (hs, cover, hn, nuc) in enumerate(layers):
        x, y = int(plan.cx[j]), int(plan.cy[j])
        lum[:, y - hs : y + hs + 1, x - hs : x + hs + 1] -= cyto_vec[j] * cover
        lum[:, y - hn : y + hn + 1, x - hn : x + hn + 1] -= haem * nuc
        if want_labels:
            labels[y - hs : y + hs + 1, x - hs : x + hs + 1][cover > 0.5] = j + 1
    return labels


def _illumination(il: dict, size: int) -> np.ndarray:
    """(size, size) float32 log light of the illumination signature `il`: gain, gradients and
    vignetting over the field's pixel centres."""
    W = H = size
    x1 = (np.arange(W) + 0.5) / W - 0.5
    y1 = (np.arange(H) + 0.5) / H - 0.5
    log_light = (
        il["log_gain"]
        + il["gradient_x"] * x1[None, :]
        + il["gradient_y"] * y1[:, None]
        - il["vignetting"] * (4.0 * x1[None, :] ** 2 + 4.0 * y1[:, None] ** 2)
    )
    return log_light.astype(np.float32)


def _sensor_noise(img: np.ndarray, rp: np.random.Generator, nz: dict) -> None:
    """Add the noise signature `nz` to `img` (3, H, W) in place, drawing from the pattern
    stream `rp`: noise common to the channels plus banding, then per-channel noise."""
    _, H, W = img.shape
    rho = nz["channel_correlation"]
    common = _gauss(rp, (H, W), nz["amplitude_levels"] * math.sqrt(rho))
    a = math.radians(nz["banding_angle_deg"])
    xs = np.arange(W, dtype=np.float32)
    ys = np.arange(H, dtype=np.float32)
    phase = (xs[None, :] * np.float32(math.cos(a)) + ys[:, None] * np.float32(math.sin(a))) * np.float32(
        2.0 * np.pi / nz["banding_period_px"]
    ) + np.float32(nz["banding_phase"])
    np.sin(phase, out=phase)
    phase *= np.float32(nz["banding_levels"])
    common += phase
    img += common
    img += _gauss(rp, (3, H, W), nz["amplitude_levels"] * math.sqrt(1.0 - rho))


# ---------------------------------------------------------------------- public API
@dataclass(frozen=True, eq=False)
class SynthData:
    """A synthetic benchmark in memory.

    Attributes:
        images: (N, 3, crop_size, crop_size) uint8 crops, in the order of `table`.
        masks: (N, 1, crop_size, crop_size) bool; the centred cell's own mask (cytoplasm and
            nucleus).
        table: DataFrame with columns id, label, parent, x, y, w, h (box in field pixels),
            sorted by id; ``CropTable.from_frame(table, id="id", box="x,y,w,h")`` reads it.
        fields: one dict per field: id, index, dominant class, class_mix, n_cells, signature
            (per mechanism, as plain numbers; identity values where not planted).
        config: the generating `SynthConfig`.
        cells: planted per-cell morphology, aligned with `table`: id, cx, cy (centre in field
            pixels) and the seven features (``log_cell_radius`` in 64-px-crop pixels, ...).
        all_cells: (N, 1, crop_size, crop_size) bool or None; every cell's pixels in the crop:
            the union of all the field's cell masks (coverage > 0.5, as `masks`) cut at the
            crop's box, so it holds `masks` plus the neighbouring cells, whole or cut by the
            crop's edge. This is the mask a deleted-signal control needs (`shortcutlab
            control --delete cell`): deleting only the centred cell leaves neighbours that, in
            single-class fields, carry the class.
    """

    images: torch.Tensor
    masks: torch.Tensor
    table: pd.DataFrame
    fields: list
    config: SynthConfig
    cells: pd.DataFrame | None = None
    all_cells: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def crop_table(self):
        """The crops as a `CropTable` with geometry."""
        from shortcutlab.data.table import CropTable

        return CropTable.from_frame(self.table, id="id", label="label", parent="parent", box="x,y,w,h", source="synth")


@dataclass(frozen=True, eq=False)
class FieldRender:
    """One whole field, for inspection and tests.

    Attributes:
        image: (3, H, W) uint8 field image.
        cells: (H, W) int32 label map: 0 background, j + 1 for the field's j-th cell (crop
            ``<field>_c<j>``); where cells overlap the later one wins.
        field: the field's dict as in `SynthData.fields`.
    """

    image: torch.Tensor
    cells: torch.Tensor
    field: dict


def _field_names(config: SynthConfig) -> str:
    return f"field{{:0{max(4, len(str(config.n_fields - 1)))}d}}"


def _field_dict(config: SynthConfig, plan: _FieldPlan, name: str) -> dict:
    labels = config.labels
    return {
        "id": name,
        "index": plan.index,
        "dominant": labels[plan.dominant],
        "class_mix": {labels[k]: _r6(v) for k, v in enumerate(plan.mix)},
        "n_cells": int(len(plan.cx)),
        "signature": plan.signature,
    }


def _check_config(config) -> SynthConfig:
    if config is None:
        return SynthConfig()
    if not isinstance(config, SynthConfig):
        raise SynthError(f"expected a SynthConfig, got {type(config).__name__}")
    return config


def synthesize(config: SynthConfig | None = None, *, workers: int | None = None) -> SynthData:
    """Render the benchmark: every field once, one crop and mask per cell.

    Args:
        config: the generating parameters (default `SynthConfig()`).
        workers: threads rendering fields (default: up to 4, one per CPU); the result does not
            depend on it.

    Returns:
        `SynthData` with N crops, N = sum of cells over fields.

    Example:
        >>> data = synthesize(SynthConfig(fields_per_class=2, crop_size=32, mechanisms="none"))
        >>> data.table["parent"].nunique()
        6
    """
    config = _check_config(config)
    workers = _workers(workers)
    _settle_allocator()
    plans = _plan(config)
    counts = np.array([len(p.cx) for p in plans])
    N, c = int(counts.sum()), config.crop_size
    offsets = np.concatenate([[0], np.cumsum(counts)])
    images = np.empty((N, 3, c, c), dtype=np.uint8)
    masks = np.zeros((N, c, c), dtype=bool)
    all_cells = np.empty((N, c, c), dtype=bool)
    sheet = _texture_sheet(config)

    def work(chunk: Sequence[_FieldPlan]) -> None:
        for plan, layers in zip(chunk, _cell_layers(config, chunk, sheet)):
            rgb, labels = _render_field(config, plan, layers, want_labels=True)  # the label map leaves the pixels alone
            o = offsets[plan.index]
            for j, (hs, cover, _, _) in enumerate(layers):
                x0, y0 = int(plan.cx[j]) - c // 2, int(plan.cy[j]) - c // 2
                images[o + j] = rgb[:, y0 : y0 + c, x0 : x0 + c]
                lo = c // 2 - hs
                masks[o + j, lo : lo + 2 * hs + 1, lo : lo + 2 * hs + 1] = cover > 0.5
                all_cells[o + j] = labels[y0 : y0 + c, x0 : x0 + c] > 0

    _run(work, [plans[i : i + _CHUNK] for i in range(0, len(plans), _CHUNK)], workers)

    fname = _field_names(config)
    width = max(2, len(str(int(counts.max()) - 1)))
    parent = np.repeat([fname.format(p.index) for p in plans], counts)
    local = np.concatenate([np.arange(k) for k in counts])
    ids = [f"{p}_c{j:0{width}d}" for p, j in zip(parent, local)]
    cx = np.concatenate([p.cx for p in plans])
    cy = np.concatenate([p.cy for p in plans])
    label = np.asarray(config.labels, dtype=object)[np.concatenate([p.label for p in plans])]
    table = pd.DataFrame(
        {"id": ids, "label": label, "parent": parent, "x": cx - c // 2, "y": cy - c // 2, "w": c, "h": c}
    )
    feat = np.concatenate([p.feat for p in plans])
    cells = pd.DataFrame({"id": ids, "cx": cx, "cy": cy})
    for k, name in enumerate(_FEATURE_NAMES):
        cells[name] = np.round(feat[:, k], 6)
    return SynthData(
        images=torch.from_numpy(images),
        masks=torch.from_numpy(masks[:, None]),
        table=table,
        fields=[_field_dict(config, p, fname.format(p.index)) for p in plans],
        config=config,
        cells=cells,
        all_cells=torch.from_numpy(all_cells[:, None]),
    )


_CHUNK = 8  # fields per rendering task: cells of a chunk are batched by patch size
_SETTLED = False


def _settle_allocator() -> None:
    """Free one 16 MiB block, once per process.

    glibc serves blocks above a dynamic threshold (128 KiB at start) with fresh mmap pages, so
    every field-sized temporary page-faults (which doubled the rendering time) until a block
    that large has been freed once; freeing one raises the threshold. Elsewhere a no-op.
    """
    global _SETTLED
    if not _SETTLED:
        np.empty(2 << 20, dtype=np.float64)
        _SETTLED = True


def render_field(config: SynthConfig, index: int) -> FieldRender:
    """Render field `index` of `config` whole, with its cell label map (the same pixels the
    crops are cut from).

    Raises:
        SynthError: `index` out of range.
    """
    config = _check_config(config)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < config.n_fields:
        raise SynthError(f"field index must be an integer in [0, {config.n_fields}), got {index!r}")
    plan = _plan(config)[int(index)]
    layers = _cell_layers(config, [plan], _texture_sheet(config))[0]
    rgb, labels = _render_field(config, plan, layers, want_labels=True)
    return FieldRender(
        image=torch.from_numpy(rgb),
        cells=torch.from_numpy(labels),
        field=_field_dict(config, plan, _field_names(config).format(int(index))),
    )


def _run(work, items, workers: int) -> None:
    """Call `work` on every item, on a thread pool when there are workers and items to share."""
    if workers > 1 and len(items) > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, items))
    else:
        for item in items:
            work(item)


def _workers(workers: int | None) -> int:
    if workers is None:
        return max(1, min(4, os.cpu_count() or 1))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SynthError(f"workers must be a positive integer, got {workers!r}")
    return workers


# ---------------------------------------------------------------------- files
def _png_rows(arrays: np.ndarray, level: int) -> np.ndarray:
    """PNG scanlines (filter byte + row) of a batch of (N, H, W, C) or (N, H, W) uint8 images.

    Filter 'None' for stored (level 0) output, where filtering cannot shrink anything, else
    'Sub' (the left neighbour's value subtracted), which helps deflate on smooth images.
    """
    a = arrays if arrays.ndim == 4 else arrays[..., None]
    n, h, w, ch = a.shape
    rows = a.reshape(n, h, w * ch)
    raw = np.empty((n, h, w * ch + 1), dtype=np.uint8)
    if level == 0:
        raw[:, :, 0] = 0
        raw[:, :, 1:] = rows
    else:
        raw[:, :, 0] = 1
        raw[:, :, 1 : 1 + ch] = rows[:, :, :ch]
        np.subtract(rows[:, :, ch:], rows[:, :, :-ch], out=raw[:, :, 1 + ch :], dtype=np.uint8)
    return raw


def _png(raw: np.ndarray, channels: int, level: int) -> bytes:
    """PNG bytes of one image from its scanlines (`_png_rows`), zlib `level`.

    A minimal encoder: Pillow's adaptive filtering costs more than the compression at these
    sizes, and the output here is deterministic for a zlib version.
    """
    h, w = raw.shape[0], (raw.shape[1] - 1) // channels

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))

    header = struct.pack(">IIBBBBB", w, h, 8, 0 if channels == 1 else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw.tobytes(), level)) + chunk(b"IEND", b"")


def _write_bytes(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # unbuffered: many small files
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _json_document(data: SynthData) -> dict:
    from shortcutlab.version import __version__

    config = data.config
    means = class_means(config)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "generator": f"shortcutlab {__version__}",
        "config": config.to_dict(),
        "derived": {
            "n_fields": config.n_fields,
            "n_crops": len(data),
            "scale": config.scale,
            "effective_strengths": config.effective_strengths,
        },
        "paths": "path and mask in manifest.csv are relative to the folder holding manifest.csv",
        "morphology": {
            "features": list(_FEATURE_NAMES),
            "within_class_sd": {ft.name: ft.sd for ft in _FEATURES},
            "bounds": {ft.name: [ft.lo, ft.hi] for ft in _FEATURES},
            "neighbour_separation_sd_at_class_signal_1": _NEIGHBOUR_SEPARATION,
            "class_means": {lab: {ft.name: _r6(means[k, i]) for i, ft in enumerate(_FEATURES)} for k, lab in enumerate(config.labels)},
            "units": "log_cell_radius: log of pixels at 64 px crops (times crop_size/64 in this benchmark); "
            "nc_ratio: nucleus over cell radius; chromatin: haematoxylin concentration; "
            "granularity: relative SD of the chromatin texture",
        },
        "optics": {
            "white_level": _WHITE,
            "background_od": list(_BACKGROUND_OD),
            "haematoxylin_od": list(_HAEMATOXYLIN),
            "cytoplasm_stain_od": [list(v) for v in _CYTOPLASM_STAINS],
            "cytoplasm_density": list(_CYTOPLASM_DENSITY),
            "texture_color": list(_TEXTURE_COLOR),
            "debris_colors": [list(v) for v in _DEBRIS_COLORS],
            "chromatin_grain_px": _CHROMATIN_GRAIN_PX * config.scale,
            "illumination_model": "light = exp(log_gain + gradient_x * x' + gradient_y * y' - vignetting * r2), "
            "x' = (x + 0.5) / W - 0.5, y' = (y + 0.5) / H - 0.5, r2 = 4 x'^2 + 4 y'^2 (field pixels x, y)",
            "pipeline": "OD = background_od + tint + texture + debris + cells; "
            "value = 255 * white_level * rgb_gain * light * exp(-OD); blur(sigma_px); "
            "+ baseline noise + sensor pattern; clip, round to uint8",
        },
        "fields": data.fields,
    }


def write_synth(data: SynthData, out_dir: str | os.PathLike, *, compress_level: int = 0, workers: int | None = None) -> dict[str, str]:
    """Write a benchmark to a folder.

    Layout: ``crops/<id>.png`` (RGB), ``masks/<id>.png`` (8-bit, 0 or 255; the centred cell),
    ``all_cells_masks/<id>.png`` (every cell in the crop, `SynthData.all_cells`; when the data
    has them), ``manifest.csv`` (id, path, mask, label, parent, x, y, w, h, then
    all_cells_mask; the paths are relative to the folder holding manifest.csv), ``cells.csv``
    (planted morphology per crop) and ``synth.json`` (every generating parameter, class means
    and each field's signature). The same data gives
    byte-identical files. A folder holding an earlier benchmark (synth.json) is replaced whole;
    any other non-empty folder is refused.

    The benchmark is built in a temporary folder beside `out_dir` and swapped in only once
    every file is written, so a write that fails (a full disk, Ctrl-C) leaves the earlier
    benchmark, or no folder, and no temporary folder.

    Args:
        data: from `synthesize`.
        out_dir: the folder (created if missing).
        compress_level: zlib level of the crop PNGs, 0 (stored, the default: 12 KiB per 64 px
            crop, 5x faster to write than level 1, which saves a third) to 9. Masks always
            deflate (a few hundred bytes each).
        workers: threads encoding PNGs (default: up to 4, one per CPU).

    Returns:
        Paths: out_dir, manifest, json, cells, crops, masks, all_cells_masks.

    Raises:
        SynthError: `out_dir` is a file, or holds the working directory (it is replaced whole).
        OutputError: `out_dir` holds a file shortcutlab did not write there (`io.claim_output_dir`),
            or the folder beside which it is built cannot be written.

    Example:
        >>> from shortcutlab import CropTable
        >>> paths = write_synth(synthesize(SynthConfig(fields_per_class=1)), "synth_demo")  # doctest: +SKIP
        >>> CropTable.from_csv(paths["manifest"], id="id", label="label", parent="parent",
        ...                    image="path", mask="mask", box="x,y,w,h")  # doctest: +SKIP
    """
    if not isinstance(data, SynthData):
        raise SynthError(f"expected SynthData from synthesize(), got {type(data).__name__}")
    compress_level = int(compress_level)
    if not 0 <= compress_level <= 9:
        raise SynthError(f"compress_level must be 0 .. 9, got {compress_level}")
    workers = _workers(workers)
    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise SynthError(f"output folder {out!r} is a file; choose a folder")
    claim_synth_dir(out)
    target, here = os.path.realpath(out), os.path.realpath(os.getcwd())
    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
        raise SynthError(f"output folder {out!r} holds the working directory, and the benchmark folder is replaced whole; choose a subfolder")
    with atomic_dir(out, "synth", SYNTH_FILES, _is_legacy_synth) as tmp:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # a temporary folder is private (0700); the benchmark is not
        _write_files(data, tmp, compress_level, workers)
    return {
        "out_dir": out,
        "manifest": os.path.join(out, "manifest.csv"),
        "json": os.path.join(out, "synth.json"),
        "cells": os.path.join(out, "cells.csv"),
        "crops": os.path.join(out, "crops"),
        "masks": os.path.join(out, "masks"),
        "all_cells_masks": os.path.join(out, "all_cells_masks"),
    }


#: what `write_synth` writes in its folder (``name/``: a folder it owns whole)
SYNTH_FILES = ("manifest.csv", "synth.json", "cells.csv", "crops/", "masks/", "all_cells_masks/")


def _is_legacy_synth(out: str) -> bool:
    """A benchmark folder written before output markers: its synth.json is a benchmark's."""
    d = read_json_object(os.path.join(out, "synth.json"))
    return d is not None and d.get("format") == FORMAT and isinstance(d.get("config"), dict)


def claim_synth_dir(out: str) -> None:
    """Refuse, before any work, a folder that holds anything but an earlier benchmark
    (`io.claim_output_dir`); remove the temporaries a killed `write_synth` left there."""
    claim_output_dir(out, "synth", SYNTH_FILES, _is_legacy_synth)


def _write_files(data: SynthData, out: str, compress_level: int, workers: int) -> None:
    """Write every file of a benchmark into the (new, empty) folder `out`."""
    crops_dir, masks_dir = os.path.join(out, "crops"), os.path.join(out, "masks")
    os.makedirs(crops_dir)
    os.makedirs(masks_dir)
    all_dir = os.path.join(out, "all_cells_masks")
    if data.all_cells is not None:
        os.makedirs(all_dir)

    ids = data.table["id"].tolist()
    mask_level = max(compress_level, 1)  # masks deflate to a few hundred bytes, quickly
    step = 256  # scanlines for a block of crops at a time

    def work(start: int) -> None:
        stop = min(start + step, len(ids))
        rows = _png_rows(data.images[start:stop].numpy().transpose(0, 2, 3, 1), compress_level)
        mrows = _png_rows(data.masks[start:stop, 0].numpy().view(np.uint8) * np.uint8(255), mask_level)
        for k, i in enumerate(range(start, stop)):
            _write_bytes(os.path.join(crops_dir, ids[i] + ".png"), _png(rows[k], 3, compress_level))
            _write_bytes(os.path.join(masks_dir, ids[i] + ".png"), _png(mrows[k], 1, mask_level))
        if data.all_cells is not None:
            arows = _png_rows(data.all_cells[start:stop, 0].numpy().view(np.uint8) * np.uint8(255), mask_level)
            for k, i in enumerate(range(start, stop)):
                _write_bytes(os.path.join(all_dir, ids[i] + ".png"), _png(arows[k], 1, mask_level))

    _run(work, range(0, len(ids), step), workers)

    t = data.table
    manifest = pd.DataFrame(
        {
            "id": t["id"],
            "path": ["crops/" + i + ".png" for i in ids],
            "mask": ["masks/" + i + ".png" for i in ids],
            "label": t["label"],
            "parent": t["parent"],
            "x": t["x"], "y": t["y"], "w": t["w"], "h": t["h"],
        }
    )
    if data.all_cells is not None:  # last, so the earlier columns read as before
        manifest[ALL_CELLS_COLUMN] = ["all_cells_masks/" + i + ".png" for i in ids]
    manifest.to_csv(os.path.join(out, "manifest.csv"), index=False, lineterminator="\n")
    if data.cells is not None:
        data.cells.to_csv(os.path.join(out, "cells.csv"), index=False, lineterminator="\n")
    with open(os.path.join(out, "synth.json"), "w") as fh:
        fh.write(json.dumps(_json_document(data), indent=2) + "\n")


def load_synth(out_dir: str | os.PathLike, *, workers: int | None = None) -> SynthData:
    """Read a benchmark written by `write_synth` back into memory.

    Raises:
        SynthError: the folder lacks synth.json or manifest.csv, or a crop has the wrong size.
    """
    out = os.fspath(out_dir)
    jpath, mpath = os.path.join(out, "synth.json"), os.path.join(out, "manifest.csv")
    for p in (jpath, mpath):
        if not os.path.isfile(p):
            raise SynthError(f"{p!r} {wrong_kind(p, 'file')}; is {out!r} a folder written by write_synth / shortcutlab synth?")
    doc, config = _read_synth_json(out, jpath)
    man = _read_synth_manifest(mpath)
    has_all = ALL_CELLS_COLUMN in man.columns
    images, masks, all_cells = _read_crops(_CropReader(out, mpath, man, config.crop_size, has_all), len(man), workers)
    table = man[["id", "label", "parent", "x", "y", "w", "h"]].copy()
    cpath = os.path.join(out, "cells.csv")
    cells = pd.read_csv(cpath, dtype={"id": str}) if os.path.exists(cpath) else None
    return SynthData(
        images=torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),
        masks=torch.from_numpy(masks[:, None]),
        table=table,
        fields=doc["fields"],
        config=config,
        cells=cells,
        all_cells=None if all_cells is None else torch.from_numpy(all_cells[:, None]),
    )


def _read_synth_json(out: str, jpath: str) -> tuple[dict, SynthConfig]:
    """The synth.json document of the benchmark folder `out` and its config; a `SynthError`
    saying what is wrong when it is not valid JSON, not a benchmark's, or damaged."""
    try:
        with open(jpath, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SynthError(f"{jpath!r} is not valid JSON ({' '.join(str(e).split())}); is {out!r} a folder written by write_synth?") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SynthError(f"{jpath!r} is not a shortcutlab synthetic benchmark (format {found!r}, expected {FORMAT!r})")
    for key, kind in (("config", dict), ("fields", list)):
        if not isinstance(doc.get(key), kind):
            raise SynthError(f"{jpath!r}: {key!r} is {type(doc.get(key)).__name__}, expected a JSON "
                             f"{'object' if kind is dict else 'list'}; the file is damaged, write the benchmark again")
    try:
        config = SynthConfig.from_dict(doc["config"])
    except (TypeError, ValueError) as e:
        raise SynthError(f"{jpath!r}: its config does not load ({' '.join(str(e).split())})") from None
    return doc, config


def _read_synth_manifest(mpath: str) -> pd.DataFrame:
    """manifest.csv, with its text columns as text; a `SynthError` when it is unreadable or
    lacks a column."""
    try:
        man = pd.read_csv(mpath, dtype={"id": str, "label": str, "parent": str, "path": str, "mask": str, ALL_CELLS_COLUMN: str},
                          keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise SynthError(f"{mpath!r} is not a readable CSV ({' '.join(str(e).split())})") from None
    missing = [col for col in ("id", "path", "mask", "label", "parent", "x", "y", "w", "h") if col not in man.columns]
    if missing:
        raise SynthError(f"{mpath!r} lacks column(s) {', '.join(missing)}; columns are: {', '.join(map(str, man.columns))}")
    return man


class _CropReader:
    """``reader(i) -> (image (c, c, 3) uint8, mask (c, c) bool, all-cells mask or None)`` of
    manifest row i, checking that the files stay inside the benchmark folder (the manifest is
    a record) and have the crop size."""

    def __init__(self, out: str, mpath: str, man: pd.DataFrame, c: int, has_all: bool) -> None:
        self.out, self.mpath, self.man, self.c, self.has_all = out, mpath, man, c, has_all

    def load(self, col: str, i: int, mode: str) -> np.ndarray:
        from PIL import Image

        path = inside(self.out, self.man[col].iat[i], f"{self.mpath}: row {i} ({col})", SynthError)
        try:
            with Image.open(path) as im:
                return np.asarray(im.convert(mode))
        except (OSError, ValueError) as e:  # missing, a folder, not an image, truncated
            raise SynthError(f"{self.mpath}: row {i} ({col}) {path!r} cannot be read as an image "
                             f"({' '.join(str(e).split()) or type(e).__name__})") from None

    def __call__(self, i: int):
        c, crop = self.c, self.man["id"].iat[i]
        img = self.load("path", i, "RGB")
        msk = self.load("mask", i, "L") > 127
        if img.shape != (c, c, 3) or msk.shape != (c, c):
            raise SynthError(f"crop {crop!r} is {img.shape[1]}x{img.shape[0]}, expected {c}x{c} (crop_size in synth.json)")
        alm = None
        if self.has_all:
            alm = self.load(ALL_CELLS_COLUMN, i, "L") > 127
            if alm.shape != (c, c):
                raise SynthError(f"all-cells mask of crop {crop!r} is {alm.shape[1]}x{alm.shape[0]}, expected {c}x{c} (crop_size in synth.json)")
        return img, msk, alm


def _read_crops(read: _CropReader, n: int, workers: int | None):
    """(n, c, c, 3) uint8 images, (n, c, c) bool masks and all-cells masks (or None) of the
    `n` manifest rows, read in `workers` threads."""
    c = read.c
    images = np.empty((n, c, c, 3), dtype=np.uint8)
    masks = np.empty((n, c, c), dtype=bool)
    all_cells = np.empty((n, c, c), dtype=bool) if read.has_all else None

    def work(i: int) -> None:
        images[i], masks[i], alm = read(i)
        if all_cells is not None:
            all_cells[i] = alm

    workers = _workers(workers)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, range(n), chunksize=64))
    else:
        for i in range(n):
            work(i)
    return images, masks, all_cells
