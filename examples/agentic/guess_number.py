"""Guess the number: a multi-turn game whose observations change what the model must say next.

The secret is a digit (the dataset's label: `data.task: reverse` with `length: 1` draws one per prompt); the model
guesses, the environment answers `higher` or `lower`, and a right guess within `rollout.max_turns` scores 1. A model
that ignores the answers finds the digit in four guesses 4 times in 10; one that halves the range each time always
does.
"""

from fasync.rollout.env_loop import Step


class GuessNumber:
    async def reset(self, task):
        self.secret = int(task.label)
        return [{"role": "user", "content": "guess 0-9"}]

    async def step(self, model_text):
        guess = model_text.strip()[:1]  # the first character is the guess
        if guess == str(self.secret):
            return Step(reward=1.0, done=True)
        if not guess.isdigit():
            return Step([{"role": "user", "content": "a digit"}])
        return Step([{"role": "user", "content": "higher" if int(guess) < self.secret else "lower"}])
