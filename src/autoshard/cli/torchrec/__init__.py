"""The command's TorchRec parts: its planner as a method (`method`), and a plan applied for real (`check`)."""
