"""The providers' shapes, in and out."""
