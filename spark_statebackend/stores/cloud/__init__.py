"""What the Azure and S3 blob stores share."""
