"""What runs next and when a run stops: the sweep's decisions that go beyond a fixed list
(``stopping.py``: early stopping rules)."""
