"""Starting, watching, recovering and stopping the pipeline's processes: what ``runner.py`` (the
command line) and the tuning sweep call to run the pipeline once."""
