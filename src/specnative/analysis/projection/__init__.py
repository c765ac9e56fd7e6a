"""Projection to hardware you don't have: a cost model of one llama.cpp forward (cost.py) from a
model's shape (shape.py) on a described device (device.py, devices.toml), fitted to measurements
(fit.py), and a measured run's acceptance priced with it (project.py). `specnative project`
(report/projection_cli.py) writes the projection's files with report/projection_output.py.
Every number it produces is a projection, labelled [projected]; none enters traces.csv."""
