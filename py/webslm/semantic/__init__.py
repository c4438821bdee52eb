"""The semantic host: every user-visible decision, in pure Python (identical in CPython and
Pyodide). What text becomes which tokens (tokenizer, chat template), which token is chosen
(sampler, counter-based RNG), and which tokens have been shown (the commit ledger).

Knows nothing of GPUs or the page; reads the tokenizer and template from a validated model.
"""
