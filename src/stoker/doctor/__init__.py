"""`stoker doctor`: measure a user's own loader, say what holds training back and which
setting helps, by how much (measured, on their dataset). See ``cli/doctor.py`` for the command.

    target.py      the user's loader recipe: dataset + arguments, from ``module:factory``
    machine.py     the machine's load from /proc: other processes' CPU, hypervisor steal
    measure.py     one bounded run of a loader against a simulated step
    diagnose.py    where the time goes and the verdict, from a run's stats (pure; the rule
                   table is profile/rules.py, shared with loader.stats())
    rng_probe.py   does __getitem__ draw from the global RNGs? (no thread opt-in then)
    candidates.py  the settings worth trying for a verdict
    sweep.py       baseline repeated (noise) and candidates, until the ranking is significant
    conclude.py    the verdict's "what to change" and the recommendation, from one function
    report.py      the text report
    trace.py       Chrome / Perfetto trace-event JSON of a run's timeline
    picture.py     the HTML / PNG picture (matplotlib, the ``doctor`` extra)
    agent.py       inside ``stoker doctor -- python train.py``: measure the script's loader
    script.py      the doctor's side of script mode
"""
