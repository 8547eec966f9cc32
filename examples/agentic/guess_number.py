"""Guess the number: a multi-turn game whose observations change what the model must say next.

The secret is a digit (the dataset's label: `data.task: reverse` with `length: 1` draws one per prompt). The model
guesses, and the environment answers `more` or `less` with the range the secret is still in (`more 5-9` after a
guess of 4 that was too low); a right guess within `rollout.max_turns` scores 1, anything else 0. Every message ends
with the range left (the first is `pick 0-9`), so the right next guess is the middle of the range the last message
names: halving it finds any digit in four guesses, while a player that ignores the answers finds it 4 times in 10.

Two choices make the game learnable by the embedded 2-layer model in minutes (docs/agentic.md): the answer names the
range left, so the next guess depends on the last message alone instead of on the whole history of guesses and
answers; and every message is 8 characters (`pick`, `more` and `less` are 4 letters; a turn is one token, the
guess, with `rollout.max_new_tokens: 1`), so each turn sits at the same positions in every trajectory.
"""

from fasync.rollout.env_loop import Step


class GuessNumber:
    async def reset(self, task):
        self.secret = int(task.label)
        self.low, self.high = 0, 9
        return self._say("pick")

    async def step(self, model_text):
        guess = model_text.strip()[:1]  # the first character is the guess
        if guess == str(self.secret):
            return Step(reward=1.0, done=True)
        if not guess.isdigit():
            return Step(self._say("pick"))
        if int(guess) < self.secret:
            self.low = max(self.low, int(guess) + 1)
            return Step(self._say("more"))
        self.high = min(self.high, int(guess) - 1)
        return Step(self._say("less"))

    def _say(self, word: str) -> list[dict]:
        return [{"role": "user", "content": f"{word} {self.low}-{self.high}"}]
