"""``specswap bench``: the phased workload benchmark that puts adaptive next to static tiers and no speculation.

    workloads.py  high / low acceptance prompts in a tune and a report set; the low, high and transition workloads
    runner.py     drive an in-process engine (add_request/step) or a running server; record requests and tiers
    report.py     per-phase and overall figures, the oracle (best static per phase), table, plot (pure but plot)
    provenance.py the command, CPU line and commit every benchmark JSON carries
    cli.py        the flags and the run: every mode over the same loaded weights, one after another

See docs/bench.md for the JSON schema.
"""
