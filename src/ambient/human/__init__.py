"""The person: escalations, the decisions that are theirs (the model and its pure rules: escalations; their files:
escalation_store), notifications with their durable outbox, and answering from Telegram.
"""
