"""The verdicts of single registered grids that need their own reading: the pilot (theory.md
13.3) and the saving in seconds on cpu_long (issue 37 part 3: seconds_long; seconds_late at 300
updates; seconds_equal, the buffer as long in seconds as on-policy)."""
