"""Fitting a device's few free parameters to measured forward times (scipy.optimize.least_squares
on log(predicted / measured), every parameter fitted in log space so it stays positive).

A parameter is (device name or None, attribute): None shares one value across every device in the
fit (a backend constant such as the per-layer overhead), a name fits it for that device only (a
per-device efficiency). Attributes are Device fields, `tflops.<class>` or `matvec_tflops.<class>`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from specnative.analysis.projection.device import Device

EFFICIENCIES = ("bw_efficiency", "compute_efficiency", "batched_bw_efficiency", "serial_share")


@dataclass
class Observation:
    device: str                         # key into the devices being fitted
    predict: Callable[[Device], float]  # predicted seconds on a device
    measured_s: float
    labels: dict = field(default_factory=dict)


def get_param(device: Device, attr: str) -> float:
    if "." in attr:  # one entry of a rate table: tflops.<class or type>, matvec_tflops.<class or type>
        table, key = attr.split(".", 1)
        return getattr(device, table)[key]
    return getattr(device, attr)


def set_param(device: Device, attr: str, value: float) -> Device:
    if "." in attr:
        table, key = attr.split(".", 1)
        return replace(device, **{table: {**getattr(device, table), key: float(value)}})
    return replace(device, **{attr: float(value)})


def _apply(devices: dict, params: list, x) -> dict:
    out = dict(devices)
    for (key, attr), value in zip(params, np.exp(x)):
        for name in ([key] if key is not None else list(out)):
            out[name] = set_param(out[name], attr, value)
    return out


def _start(devices: dict, key, attr) -> float:
    value = get_param(devices[key if key is not None else next(iter(devices))], attr)
    return math.log(value if value > 0 else 1.0)


def fit(devices: dict, params: list, observations: list):
    """The devices with `params` fitted to the observations; and scipy's result."""
    from scipy.optimize import least_squares

    if not observations:
        raise ValueError("nothing to fit: no observations")
    x0 = np.array([_start(devices, key, attr) for key, attr in params])
    upper = np.array([0.0 if attr in EFFICIENCIES else np.inf for _, attr in params])
    x0 = np.minimum(x0, upper - 1e-9)

    def residuals(x):
        fitted = _apply(devices, params, x)
        return np.array([math.log(o.predict(fitted[o.device]) / o.measured_s) for o in observations])

    result = least_squares(residuals, x0, bounds=(np.full_like(x0, -np.inf), upper), loss="soft_l1", f_scale=0.1)
    return _apply(devices, params, result.x), result


def errors(devices: dict, observations: list) -> list:
    """(observation, predicted seconds, relative error predicted/measured - 1) for each observation."""
    out = []
    for o in observations:
        predicted = o.predict(devices[o.device])
        out.append((o, predicted, predicted / o.measured_s - 1.0))
    return out
