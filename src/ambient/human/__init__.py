"""The person: escalations (decisions that are theirs), notifications with their durable outbox, and answering from
Telegram.
"""
