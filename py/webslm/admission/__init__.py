"""Admission: the proof that a model fits and computes correctly on one GPU before it runs there.

admit.py         the admission transaction tiny-gpu-admission-v1
receipt.py       CapabilityReceiptV1, the privacy-minimized evidence admission leaves behind
pipeline_key.py  PipelineKey and BindGroupKey: what a compiled pipeline and a bind group are
                 the same object for (docs/architecture.md, "Capability receipt and pipeline
                 identity")
"""
