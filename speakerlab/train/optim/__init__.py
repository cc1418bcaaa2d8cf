"""How the weights move: parameter groups and their LR shares, the LR and margin schedules, which parts are frozen
at a step, and the non-finite guard that skips a bad step."""
