"""Outcomes: a run graded against its ``--outcome`` rubric after each completed turn, until a
grader is satisfied or ``--max-iterations`` turns were graded (docs/events.md, "Outcomes")."""
