"""One run on one allocation: the job's entry points (`job`, `eval_job`), local ranks (`launch`,
`rankfork`), the trainer's loop, evaluation, weight sync, live progress, the result and tracking.
"""
