"""The paper reproduction: targets, experiments (one per table or figure), studies, figures and
the report. The top of the data flow: it may import every other room, none imports it."""
