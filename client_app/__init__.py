"""The ClientApp side: data, models, local training loops."""
