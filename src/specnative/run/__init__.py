"""The run layer both verbs stand on (sweep/ and serving/ are siblings above it): the shared flags
and their checks (options), the settings they resolve to (spec), model checks, hidden-state
drafters' files and settings, resume arguments, capacity checks and the row columns both kinds of
run write."""
