"""The .slm artifact: format (spec in docs/slm-format.md), codecs, writer and validator.

Knows nothing of GPUs or the page. The validator and model types run in Pyodide too.
"""
from .errors import ArtifactError
from .model import ModelIdentity, ValidatedModel, ValidatedModelManifest
from .validate import Validator, validate_bytes, validate_file

__all__ = ["ArtifactError", "ModelIdentity", "ValidatedModel", "ValidatedModelManifest",
           "Validator", "validate_bytes", "validate_file"]
