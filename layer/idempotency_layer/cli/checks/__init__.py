"""The operator checks of each backend (`doctor`): one module per backend, beside the Check type they return."""
