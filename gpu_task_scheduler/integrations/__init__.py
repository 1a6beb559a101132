"""One-line callbacks for the frameworks training code is written in.

Each module maps one framework's hooks onto the run's side of the protocol
(``gpu_task_scheduler.reporting``: save a checkpoint into ``GTS_CHECKPOINT_DIR``,
then ``report()`` that step; resume from it when ``GTS_RESUME_STEP`` is set; end
cleanly when paused or stopped early), and nothing in the engine knows them:

- ``gpu_task_scheduler.integrations.lightning``: ``GTSCallback``, ``resume_from()`` (Lightning 2, either import path)
- ``gpu_task_scheduler.integrations.transformers``: ``GTSCallback``, ``resume_from()`` (the Hugging Face ``Trainer``)
- ``gpu_task_scheduler.integrations.keras``: ``GTSCallback`` (Keras 3; it resumes the model itself)
- ``gpu_task_scheduler.integrations.xgboost``: ``GTSCallback``, ``resume()``
- ``gpu_task_scheduler.integrations.lightgbm``: ``GTSCallback``, ``resume()``

Each imports its framework when it is imported itself; this package imports
none. Outside a sweep (no ``GTS_METRICS_FILE``) every callback does nothing and
every resume call gives a fresh start, so a script runs by hand unchanged.
"""
