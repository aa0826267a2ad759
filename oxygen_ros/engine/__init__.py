"""One engine for one robot or many: the scheduler plans (`scheduler.py`, the package's one planner, with its stage
planners, queue policies and cost models), the model runner is the only caller of the model (`model_runner.py`),
and the runtime executes the plans and owns the threads (`runtime.py`). `docs/engine.md` walks through it.
(A package with its `__init__`, so a plain `pip install` finds it, as it does every other folder.)"""
