"""MLflow: tracking the stages' runs and registering components as models."""
