"""ppdkit: training and serving the draft components that make a frozen LLM decode faster, losslessly.

models/ (what is trained and its artifacts), data_pipeline/ (datasets, the teacher pass, the corpus), trainer/ (the
training methods and their DeepSpeed worker), registry/ (MLflow), runtime/ (the lean forward, the drafters and the one
decode loop), jobs/ (the job spec and the pipeline on Ray), bench/, serving/, cli/.
"""
