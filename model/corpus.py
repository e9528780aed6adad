"""A seeded generator of customer-support Q/A pairs for an online shop: the embedded model's training data.

Each intent has training phrasings and held-out phrasings (never used for training), slot values
(products, colours, order numbers) and an answer whose length is set on purpose: one short sentence
for the return policy, several paragraphs for the latest smartphone. That spread is what makes
requests finish at different times in the app.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

# The customer-support workload of the app: always held out from training.
WORKLOAD_QUERIES = (
    "How do I track my order?",
    "What's your return policy?",
    "Is this product available in red?",
    "Explain the features of the latest smartphone model.",
    "How long does shipping take?",
    "I received a damaged item. What should I do?",
    "Are there any ongoing sales?",
    "How do I change my delivery address?",
    "Do you offer gift wrapping?",
    "What are your best-selling items this week?",
    "How do I apply a discount code?",
)

# The workload query that names slot values: its held-out template and the values that give it.
_WORKLOAD_SLOTS = {"Is {thing} available in {colour}?": {"thing": "this product", "colour": "red"}}

IN_STOCK_COLOURS = ("black", "white", "red", "blue", "navy", "grey", "green")
SOLD_OUT_COLOURS = ("yellow", "purple", "pink", "orange", "beige", "teal")
ITEMS = (
    "hoodie",
    "canvas backpack",
    "rain jacket",
    "water bottle",
    "desk lamp",
    "yoga mat",
    "phone case",
    "wool scarf",
    "linen shirt",
    "coffee mug",
    "duvet cover",
    "running shoe",
)
GARMENTS = ("hoodie", "rain jacket", "linen shirt", "running shoe")
CODES = ("SPRING20", "WELCOME10", "SAVE15", "FREESHIP", "VIP25", "SUMMER30")
CITIES = ("London", "Paris", "Berlin", "Madrid", "Dublin", "Rome", "Lisbon", "Vienna")

SMARTPHONE_ANSWER = (
    "The Aurora X12 is our latest smartphone, and it brings big improvements over the previous model.\n\n"
    "Display: it has a 6.7-inch OLED screen with a 120 Hz refresh rate, so scrolling feels smooth, "
    "and the screen stays easy to read in bright sunlight.\n\n"
    "Camera: the triple camera system combines a 50-megapixel main camera, an ultra-wide lens and a 3x "
    "zoom lens. Night mode takes clear photos in low light, and you can record video in 4K at 60 frames "
    "per second.\n\n"
    "Performance and battery: a new eight-core processor and 8 GB of memory keep apps fast. The "
    "5,000 mAh battery lasts a full day of normal use, fast charging reaches 50 percent in about "
    "25 minutes, and the phone also supports wireless charging.\n\n"
    "Other features: the Aurora X12 is water and dust resistant, has a fingerprint reader built into the "
    "screen, supports 5G and Wi-Fi 7, and comes with 128 GB, 256 GB or 512 GB of storage. It is "
    "available in black, silver and blue, and it will receive software updates for five years."
)

PRODUCT_FEATURES = {
    "Lumen Air laptop": (
        "The Lumen Air laptop is light and quiet. It weighs 1.2 kg, has a 14-inch screen and a fanless "
        "design, so it makes no noise at all. The battery lasts up to 15 hours, and it charges over USB-C. "
        "It comes with 16 GB of memory and a 512 GB drive, which is plenty for study, office work and "
        "photo editing. The keyboard is backlit, and the webcam records in full HD."
    ),
    "Pulse wireless headphones": (
        "The Pulse wireless headphones have active noise cancelling, which blocks out traffic and office "
        "noise. The battery lasts 30 hours, and a 10-minute charge gives you 5 more hours of music. They "
        "fold flat for travel, connect to two devices at once, and have soft ear cushions for long "
        "listening. You can adjust the sound in the free Pulse app."
    ),
    "Orbit smartwatch": (
        "The Orbit smartwatch tracks your steps, heart rate and sleep, and it has built-in GPS for runs "
        "and bike rides. The battery lasts up to 7 days. It is water resistant to 50 metres, so you can "
        "wear it while swimming. It shows messages and calls from your phone, and you can pay with it "
        "in shops."
    ),
    "Nimbus tablet": (
        "The Nimbus tablet has an 11-inch screen, four speakers and a battery that lasts 12 hours of "
        "video. It works with the Nimbus pen for notes and drawing, and with a keyboard cover that turns "
        "it into a small laptop. It comes with 128 GB or 256 GB of storage, and the front camera keeps "
        "you centred during video calls."
    ),
}


@dataclass(frozen=True)
class Example:
    """One question and its answer; an on-topic answer names one of `keywords` and, if set, `slot_value`."""

    intent: str
    question: str
    answer: str
    keywords: tuple[str, ...]
    slot_value: str | None = None


Slots = dict[str, str]


@dataclass(frozen=True)
class Intent:
    """What customers ask (train and held-out templates) and how the shop answers."""

    name: str
    train: tuple[str, ...]
    heldout: tuple[str, ...]
    answer: Callable[[Slots], str]
    keywords: tuple[str, ...]
    slot_keyword: str | None = None
    decorate: bool = True
    actions: tuple[str, ...] = ()  # fill the shared how-to frames: "How can I {action}?"
    topics: tuple[str, ...] = ()  # fill the shared topic frames: "Tell me about {topic}."


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _colour_answer(slots: Slots) -> str:
    thing, colour = slots["thing"], slots["colour"]
    if colour in IN_STOCK_COLOURS:
        return (
            f"Yes, {thing} is available in {colour}. Choose {colour} in the colour menu on the product page "
            "before you add it to your cart."
        )
    return (
        f"Sorry, {thing} is sold out in {colour} right now. It is still available in black, white and blue, "
        f"and you can tap Notify me on the product page to get an email when {colour} is back in stock."
    )


def _const(text: str) -> Callable[[Slots], str]:
    return lambda _slots: text


INTENTS: tuple[Intent, ...] = (
    Intent(
        "return_policy",
        actions=(
            "return an item",
            "return {thing}",
            "send back {thing}",
            "send something back",
            "return something I bought",
        ),
        topics=(
            "your return policy",
            "returns",
            "returning an item",
            "the returns policy",
            "the return window",
            "returning {thing}",
        ),
        train=(
            "What is your return policy?",
            "Can I return an item?",
            "How many days do I have to return something?",
            "Can I send back {thing}?",
            "Do you accept returns?",
            "What is the policy on returns?",
            "Can I return something I bought last week?",
            "Is it possible to return {thing}?",
            "How long do I have to return {thing}?",
            "What are the rules for returning an item?",
        ),
        heldout=(
            "What's your return policy?",
            "Tell me about your returns policy.",
            "Am I allowed to return {thing} if I don't like it?",
        ),
        answer=_const("You can return any item within 30 days of delivery for a full refund."),
        keywords=("return",),
    ),
    Intent(
        "track_order",
        actions=(
            "track my order",
            "track my package",
            "track order {order}",
            "see where my parcel is",
            "check the status of my order",
            "follow my delivery",
            "find my tracking number",
            "follow my order",
        ),
        topics=(
            "order tracking",
            "tracking my order",
            "the status of my order",
            "my tracking number",
            "where my package is",
            "order {order}",
        ),
        train=(
            "Where is my order?",
            "How can I track my order?",
            "Where is order {order}?",
            "How do I see where my package is?",
            "Can I track my parcel?",
            "I want to know where my order {order} is.",
            "Has my order shipped yet?",
            "How can I check the status of my order?",
            "Where can I find the tracking number for my order?",
            "My order {order} hasn't arrived. Where is it?",
        ),
        heldout=(
            "How do I track my order?",
            "Is there a way to follow my delivery?",
            "What is the status of order {order}?",
        ),
        answer=_const(
            "You can track your order on the Orders page of your account. Select the order and click Track "
            "package to see its status and the carrier's tracking link. We also email you the tracking "
            "number as soon as your order ships."
        ),
        keywords=("track",),
    ),
    Intent(
        "colour_availability",
        actions=(
            "buy {thing} in {colour}",
            "get {thing} in {colour}",
            "order {thing} in {colour}",
            "find {thing} in {colour}",
        ),
        train=(
            "Do you have {thing} in {colour}?",
            "Does {thing} come in {colour}?",
            "Can I get {thing} in {colour}?",
            "Is {thing} in stock in {colour}?",
            "I'd like {thing} in {colour}. Do you have it?",
            "Do you sell {thing} in {colour}?",
            "Is there a {colour} version of {thing}?",
            "What about {thing} in {colour}?",
        ),
        heldout=(
            "Is {thing} available in {colour}?",
            "Can I buy {thing} in {colour}?",
            "Do you carry {thing} in {colour}?",
        ),
        answer=_colour_answer,
        keywords=("available", "sold out", "stock"),
        slot_keyword="colour",
    ),
    Intent(
        "smartphone_features",
        topics=(
            "the latest smartphone",
            "the Aurora X12",
            "your newest phone",
            "the new smartphone model",
            "the features of the latest smartphone",
            "the latest phone model",
            "the features of the Aurora X12",
        ),
        train=(
            "What are the features of the latest smartphone?",
            "Tell me about your latest smartphone model.",
            "What can the newest phone do?",
            "What features does the Aurora X12 have?",
            "Describe your newest smartphone.",
            "What's special about the Aurora X12?",
            "Give me an overview of the latest smartphone's features.",
            "What does the new smartphone model offer?",
            "Can you describe the features of the Aurora X12?",
            "What is new in the latest phone?",
            "Tell me everything about the Aurora X12.",
        ),
        heldout=(
            "Explain the features of the latest smartphone model.",
            "What should I know about your newest smartphone?",
            "Could you explain what the Aurora X12 can do?",
        ),
        answer=_const(SMARTPHONE_ANSWER),
        keywords=("Aurora", "smartphone", "camera", "battery"),
    ),
    Intent(
        "product_features",
        topics=(
            "the {product}",
            "the features of the {product}",
            "the {product} and its features",
            "what the {product} can do",
        ),
        train=(
            "What are the main features of the {product}?",
            "Tell me about the {product}.",
            "What can the {product} do?",
            "Describe the {product} for me.",
            "Why should I buy the {product}?",
            "What does the {product} offer?",
            "What are the specs of the {product}?",
            "Is the {product} any good?",
        ),
        heldout=(
            "Explain the features of the {product}.",
            "Can you walk me through the features of the {product}?",
            "I'd like to know more about the {product}.",
        ),
        answer=lambda slots: PRODUCT_FEATURES[slots["product"]],
        keywords=(),
        slot_keyword="product_word",
    ),
    Intent(
        "shipping_time",
        actions=(
            "get my order faster",
            "get express shipping",
            "find out when my order will arrive",
            "find out how long shipping takes",
        ),
        topics=(
            "shipping times",
            "delivery times",
            "how long shipping takes",
            "express shipping",
            "how fast you ship",
            "standard shipping",
        ),
        train=(
            "How long does delivery take?",
            "When will my order arrive?",
            "How many days does shipping take?",
            "How fast do you ship?",
            "How long will it take for my package to arrive?",
            "What are your delivery times?",
            "If I order today, when will it arrive?",
            "Do you offer express shipping?",
        ),
        heldout=(
            "How long does shipping take?",
            "How quickly will I get my order?",
            "How many days until my package arrives?",
        ),
        answer=_const(
            "Standard shipping takes 3 to 5 business days. Express shipping takes 1 to 2 business days, "
            "and express orders placed before 2 pm ship the same day."
        ),
        keywords=("shipping", "days"),
    ),
    Intent(
        "damaged_item",
        actions=(
            "report a damaged item",
            "report a broken {item}",
            "get a replacement for a damaged {item}",
            "complain about a damaged package",
            "deal with a broken {item}",
        ),
        topics=(
            "a damaged item",
            "a broken {item}",
            "an item that arrived damaged",
            "my damaged {item}",
            "damaged packages",
        ),
        train=(
            "My {item} arrived broken.",
            "The {item} I ordered came damaged. What can I do?",
            "I got a broken {item}.",
            "My package arrived damaged.",
            "The item in my order is damaged.",
            "What do I do if my order arrives damaged?",
            "My {item} is damaged. Can you help?",
            "I received a broken item in my order.",
            "The box was crushed and the {item} inside is damaged.",
        ),
        heldout=(
            "I received a damaged item. What should I do?",
            "My {item} was damaged when it arrived. What now?",
            "What happens if something in my order is broken?",
        ),
        answer=_const(
            "I'm sorry your item arrived damaged. Please take a photo of the damage and the packaging, then "
            "go to Orders, select the order and choose Report a problem. We will send you a free "
            "replacement or a full refund, whichever you prefer, and you do not need to send the damaged "
            "item back. If you need help, our support team can also start the claim for you by chat."
        ),
        keywords=("damage", "replacement", "refund"),
    ),
    Intent(
        "sales",
        actions=("find items on sale", "see the sale", "get a deal", "find discounted items", "shop the sale"),
        topics=(
            "current sales",
            "ongoing sales",
            "your sale",
            "promotions",
            "deals this week",
            "special offers",
            "the spring sale",
        ),
        train=(
            "Do you have any sales right now?",
            "Is there a sale on?",
            "Are any items on sale?",
            "Do you have any deals at the moment?",
            "Is anything discounted this week?",
            "When is your next sale?",
            "Are there any special offers?",
            "Can I get anything cheaper right now?",
        ),
        heldout=(
            "Are there any ongoing sales?",
            "Are you running any promotions?",
            "Is there a current sale I can use?",
        ),
        answer=_const(
            "Yes, our spring sale is on now, with up to 40 percent off selected clothing, shoes and home "
            "items. Prices are already reduced on the product pages, so you do not need a code. The sale "
            "ends on Sunday at midnight, and you can see every discounted item on the Sale page."
        ),
        keywords=("sale",),
    ),
    Intent(
        "change_address",
        actions=(
            "change my delivery address",
            "change my shipping address",
            "update my address",
            "change the address for order {order}",
            "send my order to a new address",
            "fix the address on my order",
            "edit my delivery address",
        ),
        topics=(
            "changing my delivery address",
            "a wrong delivery address",
            "address changes",
            "updating my shipping address",
        ),
        train=(
            "How can I change my delivery address?",
            "I need to update the shipping address on my order.",
            "Can I change the address for order {order}?",
            "I moved. How do I change where my order is sent?",
            "I entered the wrong address. What can I do?",
            "Can I send my order to a different address?",
            "How do I edit the delivery address of my order?",
            "Can I change my shipping address after I ordered?",
        ),
        heldout=(
            "How do I change my delivery address?",
            "I made a mistake in my delivery address. Can I fix it?",
            "Is it possible to update the address for order {order}?",
        ),
        answer=_const(
            "If your order has not shipped yet, you can change the delivery address yourself. Go to Orders, "
            "select the order, click Edit address and save the new address. If the order has already "
            "shipped, send us the order number and we will ask the carrier to redirect it."
        ),
        keywords=("address",),
    ),
    Intent(
        "gift_wrapping",
        actions=(
            "gift wrap my order",
            "add gift wrapping",
            "get {thing} gift wrapped",
            "wrap {thing} as a gift",
            "send my order as a wrapped gift",
        ),
        topics=("gift wrapping", "gift wrap", "wrapping a present", "gift wrapping for {thing}"),
        train=(
            "Can you gift wrap my order?",
            "Do you have gift wrapping?",
            "Is gift wrap available?",
            "Can I add gift wrapping to {thing}?",
            "How much does gift wrapping cost?",
            "I'm buying a present. Can you wrap it?",
            "Can you wrap my order as a gift?",
            "Do you wrap gifts?",
        ),
        heldout=(
            "Do you offer gift wrapping?",
            "Is it possible to have my order gift wrapped?",
            "Can I get {thing} wrapped as a present?",
        ),
        answer=_const(
            "Yes, gift wrapping costs $4 per item. Select Add gift wrap at checkout, and you can add a free "
            "personal message too."
        ),
        keywords=("gift", "wrap"),
    ),
    Intent(
        "best_sellers",
        actions=(
            "see your best sellers",
            "find popular items",
            "find the most popular products",
            "see what is trending",
        ),
        topics=(
            "your best sellers",
            "best-selling items",
            "your most popular products",
            "popular items this week",
            "top sellers",
            "the most popular items",
        ),
        train=(
            "What are your most popular products?",
            "What is selling well right now?",
            "Which items are your best sellers?",
            "What do most customers buy?",
            "What are the top products this week?",
            "Can you recommend your most popular items?",
            "What are people buying this week?",
            "Which products are trending?",
        ),
        heldout=(
            "What are your best-selling items this week?",
            "What's popular in your shop at the moment?",
            "Which products sell the most?",
        ),
        answer=_const(
            "This week's best sellers are the Aurora X12 smartphone, the Pulse wireless headphones, the "
            "Orbit smartwatch, our cotton hoodie and the canvas backpack. You can see the full list, "
            "updated every Monday, on the Best sellers page."
        ),
        keywords=("best sellers", "popular", "Aurora"),
    ),
    Intent(
        "discount_code",
        actions=(
            "use a discount code",
            "enter a promo code",
            "use the code {code}",
            "redeem a voucher",
            "add a coupon code",
            "apply the code {code}",
            "apply a promo code",
            "use a discount code at checkout",
        ),
        topics=("discount codes", "promo codes", "the code {code}", "using a voucher", "coupon codes"),
        train=(
            "Where do I enter a discount code?",
            "How can I use a promo code?",
            "How do I use the code {code}?",
            "Where do I put my coupon code?",
            "I have a voucher code. How do I use it?",
            "Can I use a discount code on my order?",
            "How do I redeem the code {code}?",
            "Where can I type in a promo code?",
        ),
        heldout=(
            "How do I apply a discount code?",
            "Where does the code {code} go?",
            "How can I get my discount code to work at checkout?",
        ),
        answer=_const(
            "To apply a discount code, go to checkout and type the code in the Discount code box, then click "
            "Apply. The discount appears in the order summary before you pay. You can use one code per order."
        ),
        keywords=("code",),
    ),
    Intent(
        "payment_methods",
        actions=(
            "pay with PayPal",
            "pay by credit card",
            "pay in instalments",
            "pay with Apple Pay",
            "pay for my order",
        ),
        topics=("payment methods", "payment options", "paying in instalments", "ways to pay"),
        train=(
            "What payment methods do you accept?",
            "Can I pay with PayPal?",
            "Do you take credit cards?",
            "How can I pay for my order?",
            "Can I pay in instalments?",
            "Which cards do you accept?",
            "Do you accept Apple Pay?",
        ),
        heldout=(
            "What are my options to pay?",
            "Is it possible to pay with Google Pay?",
        ),
        answer=_const(
            "We accept Visa, Mastercard, American Express, PayPal, Apple Pay and Google Pay. You can also "
            "pay in three instalments at checkout."
        ),
        keywords=("pay", "Visa"),
    ),
    Intent(
        "password_reset",
        actions=("reset my password", "change my password", "recover my password", "log in if I forgot my password"),
        topics=("a forgotten password", "resetting my password", "password problems"),
        train=(
            "I forgot my password.",
            "How do I reset my password?",
            "I can't log in to my account.",
            "How can I change my password?",
            "I'm locked out of my account. What do I do?",
            "My password doesn't work.",
        ),
        heldout=(
            "I can't remember my password. Can you help?",
            "How do I get back into my account?",
        ),
        answer=_const(
            "Click Sign in, then Forgot password, and enter your email address. We will send you a link to "
            "choose a new password. The link is valid for 24 hours."
        ),
        keywords=("password",),
    ),
    Intent(
        "create_account",
        actions=("create an account", "sign up", "open an account", "register", "make an account"),
        topics=("creating an account", "signing up", "registration"),
        train=(
            "How do I create an account?",
            "How can I sign up?",
            "Can I open an account with you?",
            "How do I register on your website?",
            "Do I need an account to order?",
        ),
        heldout=(
            "Can I get an account on your site?",
            "Where can I register?",
        ),
        answer=_const(
            "Click Sign in at the top of the page and choose Create account. You can also check out as a "
            "guest without an account."
        ),
        keywords=("account",),
    ),
    Intent(
        "cancel_order",
        actions=("cancel my order", "cancel order {order}", "stop my order", "cancel an order I just placed"),
        topics=("cancelling an order", "order cancellation", "cancelling order {order}"),
        train=(
            "How do I cancel my order?",
            "Can I cancel order {order}?",
            "I want to cancel my order.",
            "I ordered by mistake. Can I cancel it?",
            "Is it too late to cancel my order?",
            "Please cancel my last order.",
        ),
        heldout=(
            "Can I still cancel my order?",
            "I changed my mind. How do I cancel order {order}?",
        ),
        answer=_const(
            "You can cancel an order within one hour of placing it. Go to Orders, select the order and "
            "click Cancel order. After one hour the order is already being packed, so please return it "
            "when it arrives instead."
        ),
        keywords=("cancel",),
    ),
    Intent(
        "refund_status",
        actions=("get my refund", "check my refund", "get my money back", "check the status of my refund"),
        topics=("my refund", "refund times", "how long refunds take", "the status of my refund"),
        train=(
            "When will I get my refund?",
            "Where is my refund?",
            "How long do refunds take?",
            "I returned an item but have not been refunded yet.",
            "How will I get my money back?",
            "Has my refund been processed?",
        ),
        heldout=(
            "How long until my refund arrives?",
            "When do I get my money back for a return?",
        ),
        answer=_const(
            "We issue your refund within 5 business days after your return arrives at our warehouse. The "
            "money goes back to the card or account you paid with."
        ),
        keywords=("refund",),
    ),
    Intent(
        "contact_support",
        actions=(
            "contact customer service",
            "reach your support team",
            "talk to a person",
            "get in touch with support",
            "chat with someone",
            "email you",
        ),
        topics=("contacting support", "customer service", "your support team", "live chat"),
        train=(
            "How can I contact customer service?",
            "Can I speak to a person?",
            "What is your phone number?",
            "How do I reach your support team?",
            "Is there a live chat?",
            "Can I email you?",
        ),
        heldout=(
            "How do I get in touch with you?",
            "Can I talk to someone from support?",
        ),
        answer=_const(
            "You can chat with our support team from 8 am to 8 pm every day, or email help@shop.example "
            "and we will reply within 24 hours."
        ),
        keywords=("support", "chat", "email"),
    ),
    Intent(
        "size_guide",
        actions=("find my size", "choose the right size", "pick a size for the {garment}", "check the size chart"),
        topics=("sizes", "the size guide", "sizing for the {garment}", "the size chart"),
        train=(
            "How do I find my size?",
            "Do you have a size chart?",
            "What size should I order?",
            "Does the {garment} run small?",
            "How do I know which size of {garment} to buy?",
            "Where is the size guide?",
        ),
        heldout=(
            "Which size is right for me?",
            "Is there a sizing guide for the {garment}?",
        ),
        answer=_const(
            "Every clothing and shoe page has a Size guide link under the size menu. If you are between two "
            "sizes, we suggest the larger one, and exchanges for a different size are free."
        ),
        keywords=("size",),
    ),
    Intent(
        "warranty",
        actions=("make a warranty claim", "use my warranty", "claim the warranty on the {product}"),
        topics=("the warranty", "the warranty on the {product}", "warranty claims", "guarantees on electronics"),
        train=(
            "Is there a warranty on the {product}?",
            "Do your products have a warranty?",
            "What does the warranty cover?",
            "How long is the warranty?",
            "My {product} stopped working. Is it under warranty?",
            "Do electronics come with a guarantee?",
        ),
        heldout=(
            "Does the {product} come with a warranty?",
            "What warranty do you give on electronics?",
        ),
        answer=_const(
            "All electronics come with a two-year warranty that covers faults, but not accidental damage. "
            "To make a claim, contact our support team with your order number."
        ),
        keywords=("warranty",),
    ),
    Intent(
        "international_shipping",
        actions=("ship to {city}", "order from abroad", "get delivery to another country", "send an order to {city}"),
        topics=("international shipping", "shipping abroad", "delivery to other countries", "delivery to {city}"),
        train=(
            "Do you ship abroad?",
            "Can you deliver to {city}?",
            "Do you ship internationally?",
            "Which countries do you deliver to?",
            "Can I order from another country?",
        ),
        heldout=(
            "Do you deliver outside the country?",
            "Is international delivery possible?",
        ),
        answer=_const(
            "Yes, we ship to more than 40 countries. International delivery takes 5 to 10 business days, and "
            "the cost is shown at checkout."
        ),
        keywords=("countries", "ship"),
    ),
    Intent(
        "thanks",
        train=("Thank you!", "Thanks a lot.", "Thanks for your help.", "Great, thank you.", "Thank you so much!"),
        heldout=("Thanks, that helps!", "Many thanks."),
        answer=_const("You're welcome! Have a great day."),
        keywords=("welcome",),
        decorate=False,
    ),
    Intent(
        "greeting",
        train=("Hello!", "Hi there.", "Good morning!", "Hey, is anyone there?", "Hello, can you help me?"),
        heldout=("Hi!", "Good afternoon."),
        answer=_const("Hello! How can I help you today?"),
        keywords=("help",),
        decorate=False,
    ),
)

# Shared frames, filled with an intent's actions or topics; the held-out frames are never trained on.
HOWTO_FRAMES = (
    "How do I {action}?",
    "How can I {action}?",
    "Can you tell me how to {action}?",
    "What do I need to do to {action}?",
    "I need to {action}.",
    "I want to {action}. How?",
    "Help me {action}, please.",
    "What's the best way to {action}?",
    "Where do I go to {action}?",
    "Please explain how to {action}.",
    "Can I {action}?",
    "I'd like to {action}.",
    "How would I {action}?",
)
HELDOUT_HOWTO_FRAMES = (
    "Is there a way to {action}?",
    "Could you show me how to {action}?",
    "What steps do I take to {action}?",
)
TOPIC_FRAMES = (
    "Tell me about {topic}.",
    "I have a question about {topic}.",
    "What can you tell me about {topic}?",
    "Info on {topic}, please.",
    "Can you explain {topic}?",
    "Question about {topic}.",
    "I'm asking about {topic}.",
    "Can you help me with {topic}?",
    "I need help with {topic}.",
)
HELDOUT_TOPIC_FRAMES = (
    "I'd like some information about {topic}.",
    "Could you give me details on {topic}?",
    "What are the details of {topic}?",
)
PREFIXES = ("", "", "", "", "Hi, ", "Hello, ", "Hi there! ", "Quick question: ", "Hey, ", "Excuse me, ")
SUFFIXES = ("", "", "", "", " Thanks!", " Thank you.", " Thanks in advance.", " Please help.")


def _framed(frames: tuple[str, ...], field: str, fillers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(frame.replace("{" + field + "}", filler) for frame in frames for filler in fillers)


def phrasings(intent: Intent, heldout: bool) -> list[tuple[str, ...]]:
    """The intent's question templates, in groups: its own, the how-to frames, the topic frames."""
    own = intent.heldout if heldout else intent.train
    howto = _framed(HELDOUT_HOWTO_FRAMES if heldout else HOWTO_FRAMES, "action", intent.actions)
    topic = _framed(HELDOUT_TOPIC_FRAMES if heldout else TOPIC_FRAMES, "topic", intent.topics)
    return [group for group in (own, howto, topic) if group]


def _slots(rng: random.Random) -> Slots:
    item = rng.choice(ITEMS)
    product = rng.choice(tuple(PRODUCT_FEATURES))
    return {
        "thing": rng.choice(("this product", "this item", f"the {item}", f"the {item}", f"this {item}")),
        "item": item,
        "garment": rng.choice(GARMENTS),
        "colour": rng.choice(IN_STOCK_COLOURS + SOLD_OUT_COLOURS),
        "product": product,
        "product_word": product.split()[0],
        "order": f"#{rng.randint(10000, 99999)}",
        "code": rng.choice(CODES),
        "city": rng.choice(CITIES),
    }


def _decorate(question: str, rng: random.Random) -> str:
    prefix, suffix = rng.choice(PREFIXES), rng.choice(SUFFIXES)
    first_word = question.split()[0]
    if prefix.endswith((", ", ": ")) and first_word not in ("I", "I'm", "I'd", "I've") and question[1:2].islower():
        question = question[0].lower() + question[1:]
    text = prefix + question + suffix
    roll = rng.random()
    if roll < 0.08:
        text = text.lower()
    elif roll < 0.14:
        text = text.rstrip("?.!")
    return text


def _example(intent: Intent, template: str, rng: random.Random, decorate: bool, fixed: Slots | None = None) -> Example:
    slots = _slots(rng) | (fixed or {})
    question = _cap(template.format(**slots))
    answer = _cap(intent.answer(slots))
    slot_value = slots[intent.slot_keyword] if intent.slot_keyword else None
    if decorate and intent.decorate:
        question = _decorate(question, rng)
    return Example(intent.name, question, answer, intent.keywords or (slot_value or "",), slot_value)


def normalize(question: str) -> str:
    """Lower case, letters and digits only: two phrasings that differ only in punctuation are the same."""
    return " ".join(re.sub(r"[^a-z0-9 ]+", " ", question.lower().replace("'", "")).split())


def heldout_examples(per_template: int = 2, seed: int = 1234) -> list[Example]:
    """Held-out phrasings (the app's workload queries among them), asked plainly, for evaluation only.

    Each held-out template of an intent, with `per_template` slot draws, plus one question from a
    held-out how-to frame and one from a held-out topic frame where the intent has those.
    """
    rng = random.Random(seed)
    examples, seen = [], set()
    for intent in INTENTS:
        for template in intent.heldout:
            if template in _WORKLOAD_SLOTS:
                examples.append(_example(intent, template, rng, decorate=False, fixed=_WORKLOAD_SLOTS[template]))
                seen.add(normalize(examples[-1].question))
            copies = per_template if "{" in template else 1
            for _ in range(copies):
                example = _example(intent, template, rng, decorate=False)
                if normalize(example.question) not in seen:
                    seen.add(normalize(example.question))
                    examples.append(example)
        for group in phrasings(intent, heldout=True)[1:]:
            example = _example(intent, rng.choice(group), rng, decorate=False)
            if normalize(example.question) not in seen:
                seen.add(normalize(example.question))
                examples.append(example)
    return examples


def training_examples(count: int, seed: int = 0) -> list[Example]:
    """`count` training pairs: uniform over intents, then over groups of phrasings, then templates.

    A question that contains a held-out phrasing (after normalising) is drawn again, so no held-out
    question is ever seen in training, however it is decorated.
    """
    rng = random.Random(seed)
    held = [f" {normalize(example.question)} " for example in heldout_examples()]
    held += [f" {normalize(query)} " for query in WORKLOAD_QUERIES]
    examples: list[Example] = []
    while len(examples) < count:
        intent = rng.choice(INTENTS)
        group = rng.choice(phrasings(intent, heldout=False))
        example = _example(intent, rng.choice(group), rng, decorate=True)
        padded = f" {normalize(example.question)} "
        if not any(phrase in padded for phrase in held):
            examples.append(example)
    return examples
