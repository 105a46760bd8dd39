"""The person: escalations, the decisions that are theirs (the model and its pure rules: escalations; their files:
escalation_store); notifications: the text a person reads (messages), its delivery through apprise (notify) and the
durable retry outbox (outbox); answering from Telegram (telegram); whether each channel reaches the person
(channelstate).
"""
