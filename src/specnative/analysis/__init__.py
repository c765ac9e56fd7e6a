"""The decisions and the cost model behind the reports: the advisor's verdict per regime
(advisor.py), the factorial analysis of the tidy repeats (tidy.py, factorial.py), the regression
decision between two runs and their regime matching (compare.py, compare_regimes.py), which k the
cost curve predicts (pick_k.py), the break-even alpha (break_even.py), the serving crossover and
advice per load band (crossover.py) and the projection to other hardware (projection/).

Nothing here renders: report/ and serving/report.py turn these numbers into summary.md, tables
and figures, and import this package, never the reverse."""
