"""The planner's calibration: published (and here measured) step times beside its predictions
and the fit of a device's rates to them (fit.py), the kernel's tile cost and the matmuls' rate
measured on this machine (measure.py), and the calibrations measured so far (tables/<device>.json,
which planner/devices.py reads at import). scripts/calibrate.py runs them."""
