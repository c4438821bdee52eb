"""The Python half of the Web Worker (worker/worker.mjs), one idea per module:

    loader.py       ModelLoader: validates a .slm while the worker streams its bytes in
    engine_host.py  EngineHost: the loaded model and the engine that answers for it
                    (admission, answers, cancel, status, conformance, unload)
    requests.py     the page's generation request, checked, and the errors a request ends in
    test_hooks.py   requests only tests and benchmarks make (gpu-probe, kernel-golden,
                    sampler-check, tokenizer-check, lose-device)

The worker imports webslm.worker_api, which names everything it calls.
"""
