"""Parsing of vendors' visible-devices variables into visible→physical device maps.

One module per vendor family, because each follows its own documented rules:

* :mod:`accelplat._visible.cuda` — ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``;
* :mod:`accelplat._visible.rocm` — ``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` (and
  ``CUDA_VISIBLE_DEVICES`` as HIP honours it);
* :mod:`accelplat._visible.oneapi` — ``ZE_AFFINITY_MASK`` and ``ONEAPI_DEVICE_SELECTOR``.

Parsers are pure functions of the variable's text: they read no environment and import nothing
from vendors, so they can be tested exhaustively.
"""
