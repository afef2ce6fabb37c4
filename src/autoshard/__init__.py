"""AutoShard study: embedding-table sharding with a neural cost model and RL.

Data flow, top to bottom: tables -> costs -> cost model -> policy -> plans -> scores.
"""

__version__ = "0.1.0"
