"""A feature: what admission reads of Tekton. view.py keeps its definitions (Tasks, StepActions,
Pipelines: the image finder's index, core.images.TektonObjects) and its two settings (feature-flags'
`coschedule`, config-defaults' default pod template)."""
