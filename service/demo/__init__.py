"""The demo: a synthetic corpus and the end-to-end run of ``vidlake demo``.

* :mod:`service.demo.corpus` — :func:`~service.demo.corpus.generate_corpus`, a realistic
  synthetic corpus for the demo, integration tests and benchmarks (its world, rows and
  latents in :mod:`~service.demo.world`, :mod:`~service.demo.rows` and
  :mod:`~service.demo.latents`);
* :mod:`service.demo.run` — :func:`~service.demo.run.run_demo`, the demo itself.
"""
