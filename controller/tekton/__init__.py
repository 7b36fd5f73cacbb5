"""A feature: what admission reads of Tekton. core.py indexes its definitions (Tasks, StepActions,
Pipelines: the image finder's index, `TektonObjects`); view.py keeps that index and Tekton's two settings
(feature-flags' `coschedule`, config-defaults' default pod template)."""
